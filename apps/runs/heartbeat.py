"""Worker health: every Celery worker writes its own heartbeat row.

Why not `celery inspect ping`: a broadcast waits for a reply timeout on every page view,
and a solo-pool GPU worker busy with a training step cannot answer it at all. Instead a
daemon thread in each worker's main process upserts a `WorkerHeartbeat` every
`RFT_HEARTBEAT_SECONDS` (one small UPDATE), listing the worker's queues, pool and the tasks
it is running now (`celery.worker.state.active_requests`, which the main process keeps for
every pool). The thread keeps beating while a solo worker runs a long task, so the page
tells "busy for 4 minutes on train_step" apart from "gone" (no beat for
RFT_WORKER_DEAD_SECONDS), and the RFT core's loop sends a gone worker's step again.

The signal handlers are connected when this module is imported; `apps.control.tasks` imports
it, and the Celery app autodiscovers that module in every worker.
"""

from __future__ import annotations

import inspect
import logging
import os
import threading
from datetime import UTC, datetime, timedelta
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, TypedDict

from celery import signals
from django.conf import settings
from django.db import close_old_connections, connection
from django.utils import timezone

from apps.runs.models import WorkerHeartbeat
from rftweb.taskkit import on_signal

if TYPE_CHECKING:
    from celery.worker.consumer import Consumer

log = logging.getLogger(__name__)


class ActiveTask(TypedDict):
    """A task a worker is running, as its heartbeat stores it (never its arguments)."""

    id: str
    name: str
    run_id: int | None
    started_at: str | None  # ISO 8601


class WorkerHealth(TypedDict):
    beat: WorkerHeartbeat
    state: str  # alive / busy / stale / stopped
    age: float  # seconds since its last beat



def heartbeat_interval() -> float:
    return float(settings.RFT_HEARTBEAT_SECONDS)


def worker_heartbeat_record(
    *,
    hostname: str,
    queues: list[str],
    pool: str,
    concurrency: int,
    pid: int,
    active: Sequence[Mapping[str, object]],  # ActiveTask rows (older beats stored other keys)
    processed: int = 0,
    started_at: datetime | None = None,
) -> WorkerHeartbeat:
    """Upsert the worker's row: its last sign of life and what it is doing. `started_at`
    (the worker's start) replaces the stored one: a worker restarted under the same name is
    a new worker, and what the old one was running is lost (apps/control/conductor.py)."""
    now = timezone.now()
    defaults: dict[str, object] = {
        "queues": sorted(queues),
        "pool": pool,
        "concurrency": concurrency,
        "pid": pid,
        "active": active,
        "processed": processed,
        "last_seen": now,
        "stopped_at": None,
    }
    if started_at is not None:
        defaults["started_at"] = started_at
    beat, _ = WorkerHeartbeat.objects.update_or_create(
        hostname=hostname, defaults=defaults, create_defaults={**defaults, "started_at": started_at or now},
    )
    return beat


def worker_heartbeat_stop(*, hostname: str) -> int:
    """The worker shut down cleanly: say so rather than let it go stale."""
    now = timezone.now()
    return WorkerHeartbeat.objects.filter(hostname=hostname).update(stopped_at=now, last_seen=now, active=[])


def workers_health(*, now: datetime | None = None, forget_after: timedelta = timedelta(days=1)) -> list[WorkerHealth]:
    """Every worker seen lately, with `state` alive / busy / stale / stopped."""
    now = now or timezone.now()
    stale = timedelta(seconds=settings.RFT_WORKER_DEAD_SECONDS)
    rows: list[WorkerHealth] = []
    for beat in WorkerHeartbeat.objects.filter(last_seen__gte=now - forget_after):
        if beat.stopped_at is not None:
            state = "stopped"
        elif now - beat.last_seen > stale:
            state = "stale"
        else:
            state = "busy" if beat.active else "idle"
        rows.append({"beat": beat, "state": state, "age": (now - beat.last_seen).total_seconds()})
    return rows


def task_run_id(*, name: str, args: Iterable[object] | None, kwargs: object) -> int | None:
    """The run a task works for (its `run_id` argument), or None for a task of no one run."""
    value = (kwargs or {}).get("run_id") if isinstance(kwargs, dict) else None
    if value is None:
        from celery import current_app

        try:
            params = list(inspect.signature(current_app.tasks[name].run).parameters)
            value = list(args or [])[params.index("run_id")]
        except (KeyError, ValueError, IndexError, TypeError):
            return None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _active_tasks() -> list[ActiveTask]:
    from celery.worker import state

    tasks: list[ActiveTask] = []
    for request in list(state.active_requests):
        started = getattr(request, "time_start", None)
        tasks.append({
            "id": request.id,
            "name": request.name,
            # The run, never the arguments: those hold prompts, which only the run's people
            # may read (the workers page shows each task to its run's people only).
            "run_id": task_run_id(name=request.name, args=request.args, kwargs=request.kwargs),
            "started_at": datetime.fromtimestamp(started, tz=UTC).isoformat() if started else None,
        })
    return tasks


class _Beater(threading.Thread):
    def __init__(self, *, hostname: str, queues: list[str], pool: str, concurrency: int) -> None:
        super().__init__(name="rft-heartbeat", daemon=True)
        self.hostname, self.queues, self.pool, self.concurrency = hostname, queues, pool, concurrency
        self.started_at = timezone.now()
        self.stopping = threading.Event()

    def beat(self) -> None:
        from celery.worker import state

        try:
            worker_heartbeat_record(
                hostname=self.hostname, queues=self.queues, pool=self.pool, concurrency=self.concurrency,
                pid=os.getpid(), active=_active_tasks(), processed=sum(state.total_count.values()),
                started_at=self.started_at,
            )
        except Exception:  # a database hiccup must not kill the worker; the next beat retries
            log.exception("heartbeat: could not record %s", self.hostname)
        finally:
            close_old_connections()

    def run(self) -> None:
        interval = heartbeat_interval()
        while not self.stopping.is_set():
            self.beat()
            self.stopping.wait(interval)
        connection.close()


_beater: _Beater | None = None


def _describe(consumer: Consumer) -> tuple[str, list[str], str, int]:
    controller = consumer.controller
    queues = [q.name for q in consumer.app.amqp.queues.consume_from.values()]
    pool_cls = getattr(controller, "pool_cls", None)
    module = getattr(pool_cls, "__module__", "") or ""
    pool = module.rsplit(".", 1)[-1] if module.startswith("celery.concurrency") else getattr(pool_cls, "__name__", str(pool_cls))
    # A solo pool runs one task at a time whatever --concurrency says.
    concurrency = 1 if pool == "solo" else int(getattr(controller, "concurrency", 1) or 1)
    return consumer.hostname, queues, pool, concurrency


@on_signal(signals.worker_ready)
def _on_worker_ready(sender: Consumer | None = None, **_: object) -> None:
    global _beater
    try:
        hostname, queues, pool, concurrency = _describe(sender)
    except Exception:
        log.exception("heartbeat: could not describe the worker; no heartbeats")
        return
    _beater = _Beater(hostname=hostname, queues=queues, pool=pool, concurrency=concurrency)
    _beater.start()


# Tasks that serve one API request each (the OpenAI-compatible endpoint, /rollouts): tens
# of milliseconds, many a second. An edge beat is a new thread with a new database
# connection and a write, which cost such a task about as much CPU as its generation on a
# busy host; the interval's beats show these workers. The same holds for the RFT core's
# loop beat (every RFT_CONDUCT_SECONDS, milliseconds each: its two edge beats were most of
# the conductor worker's CPU per beat, bench/async_vs_sync) and the short housekeeping beats.
QUICK_TASKS = frozenset({
    "workers.explore.chat.chat",
    "workers.explore.explorer.generate",
    "apps.control.conductor_beat.conductor_beat_task",
    "apps.buffer.tasks.lease_reap_task",
    "apps.feedback.tasks.feedback_wait_expire_task",
    "apps.feedback.tasks.assignment_reap_task",
})


@on_signal(signals.task_prerun, signals.task_postrun)
def _on_task_edge(sender: object = None, **_: object) -> None:
    # Beat at once when a task starts or ends in a solo worker (same process), so the page
    # shows the current task without waiting for the next interval.
    if getattr(sender, "name", None) in QUICK_TASKS:
        return
    if _beater is not None and _beater.is_alive() and threading.current_thread() is threading.main_thread():
        threading.Thread(target=_edge_beat, args=(_beater,), daemon=True).start()


def _edge_beat(beater: _Beater) -> None:
    """One beat on a thread of its own, which then ends: it closes its connection itself.
    Workers keep connections (RFT_WORKER_CONN_MAX_AGE), so `beat`'s close_old_connections
    leaves a healthy one open, and an ended thread's connection waited for the garbage
    collector: two per step, until a restarted Postgres ran out of slots (tests/test_faults)."""
    try:
        beater.beat()
    finally:
        connection.close()


@on_signal(signals.worker_shutdown)
def _on_worker_shutdown(**_: object) -> None:
    if _beater is None:
        return
    _beater.stopping.set()
    try:
        worker_heartbeat_stop(hostname=_beater.hostname)
    except Exception:
        log.exception("heartbeat: could not record the shutdown of %s", _beater.hostname)
    finally:
        close_old_connections()
