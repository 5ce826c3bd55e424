"""Typed live events on a run's stream (its Channels group), publishable from anywhere (views,
Celery tasks, management commands).

Each web process subscribes to a run's stream once, for all its sockets of that run
(apps/runs/fanout.py), and forwards `{"type": "experience.created", "payload": {...}}` to the
browser as it came, or several in order in one `{"type": "batch", "events": [...]}` frame.
Events published together cross the layer as one envelope (`layer_events` unpacks it).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Mapping, Sequence
from typing import Any, TypedDict

from channels.layers import get_channel_layer

log = logging.getLogger(__name__)

EVENT_TYPES = (
    "experience.created",
    "feedback.saved",
    "weights.synced",
    "run.metric",
    "run.status",
    "buffer.counts",
    "worker.heartbeat",
    # A run's explore or train task failed (apps/runs/failures.py).
    "worker.error",
    # A held-out evaluation finished (apps.runs.services.eval_result_record).
    "eval.result",
    # The run ended and its people were notified (apps/control/notifications.py).
    "notification.created",
    # Labels may have changed state (apps.feedback.ledger) for a reason other than a label
    # saved (feedback.saved) or the run's status (run.status): labels_changed_publish.
    "labels.changed",
)


def run_stream_name(run_id: int) -> str:
    """The name of a run's stream: the Channels group its live events go to ("group" alone
    means an experience group here: docs/concepts.md, Names)."""
    return f"run.{run_id}"


# The runs list's live refresh (RunsListConsumer): one stream for every list page, told only
# "run N changed"; each socket passes on the notices for runs its user may see, and the page
# fetches its rows over HTTP, filtered as always. Heartbeats change no row.
RUNS_LIST_STREAM = "runs"
RUNS_LIST_NOTICE = "runs.changed"
_LIST_QUIET = frozenset({"worker.heartbeat"})
# A busy run (a metric a step, an experience a rollout) tells the lists at most once per this
# many seconds per process; the last change of a burst is always told.
RUNS_LIST_NOTICE_SECONDS = 1.0


# Several events sent together travel as one layer message, an envelope `{"type": "events",
# "events": [...]}`: an explore step's 128 `experience.created` events cost one Redis round trip
# instead of 128 (40 ms of every step, waited for on the step's path). Envelopes stay under
# this many bytes of text (a step of long answers goes as several).
ENVELOPE = "events"
ENVELOPE_BYTES = 256 * 1024


class LayerMessage(TypedDict):
    """One event as it goes onto the run's stream."""

    type: str
    payload: Mapping[str, object]


class Envelope(TypedDict):
    """Several events in one layer message (type ENVELOPE)."""

    type: str
    events: list[LayerMessage]


def _message(type: str, payload: Mapping[str, object]) -> LayerMessage:
    if type not in EVENT_TYPES:
        raise ValueError(f"unknown event type {type!r}; known: {', '.join(EVENT_TYPES)}")
    return {"type": type, "payload": payload}


def layer_events(message: dict[str, Any]) -> list[LayerMessage]:
    """The events one layer message of a run's stream carries, in order: itself, or an
    envelope's. Every reader of the stream (the fanout, the API's event stream) goes through it."""
    if message.get("type") == ENVELOPE:
        return [{"type": e["type"], "payload": e.get("payload", {})} for e in message.get("events", ())]
    return [{"type": message["type"], "payload": message.get("payload", {})}]


def _envelopes(messages: Sequence[LayerMessage]) -> list[LayerMessage | Envelope]:
    """`messages` as few layer messages as fit ENVELOPE_BYTES (its texts counted: a cheap
    upper part of the size, not an encoding), in order; a lone event goes as itself."""
    out: list[list[LayerMessage]] = []
    size = ENVELOPE_BYTES
    for m in messages:
        weight = 64 + sum(len(v) for v in m["payload"].values() if isinstance(v, str))
        if size + weight > ENVELOPE_BYTES:
            out.append([])
            size = 0
        out[-1].append(m)
        size += weight
    return [chunk[0] if len(chunk) == 1 else {"type": ENVELOPE, "events": chunk} for chunk in out]


def event_publish(*, run_id: int, type: str, payload: Mapping[str, object]) -> None:
    """Send one event to the run's stream. Never raises for a broken layer: live events are
    a view of the buffer, which stays the source of truth."""
    event_publish_many(run_id=run_id, events=[(type, payload)])


def event_publish_many(*, run_id: int, events: Sequence[tuple[str, Mapping[str, object]]]) -> None:
    """Send several events to the run's stream, in order, from sync code, and wait until they
    are sent. One hop into the process's publisher loop for all of them."""
    messages = [_message(type, payload) for type, payload in events]
    layer = get_channel_layer()
    if layer is None or not messages:
        return
    if any(m["type"] not in _LIST_QUIET for m in messages):
        runs_list_touch(run_id=run_id)
    stream = run_stream_name(run_id)

    async def send_all() -> None:
        for message in _envelopes(messages):
            await layer.group_send(stream, message)

    future = asyncio.run_coroutine_threadsafe(send_all(), _publisher_loop())
    try:
        future.result(timeout=10)
    except Exception:  # the layer being down must not fail a rollout or a training step
        future.cancel()
        log.exception("event_publish: could not send %s event(s) to run %s", len(messages), run_id)


# Sync callers (Celery tasks, views, commands) publish through one event loop per process on
# a daemon thread. async_to_sync would make a new loop per call, and with it a new Redis
# connection: ~4 ms a call instead of ~0.3 ms for one event. The thread also serves callers
# on a thread that runs a loop of its own (a Playwright-driven test, a sync view under an
# async server), which async_to_sync refuses to block.
_publisher: tuple[asyncio.AbstractEventLoop, threading.Thread] | None = None
_publisher_lock = threading.Lock()


def _publisher_loop() -> asyncio.AbstractEventLoop:
    global _publisher
    with _publisher_lock:
        if _publisher is None or not _publisher[1].is_alive():
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name="event-publish", daemon=True)
            thread.start()
            _publisher = (loop, thread)
        return _publisher[0]


# Access that narrows (a member removed, an account deactivated, a logout, a password
# changed, a key revoked) is told to every web process on one stream: each re-checks its open
# sockets of that person (apps/runs/socket_access.py) and the API's event streams of that key,
# and closes those that lost access. `user` None: anyone's access may have changed.
ACCESS_STREAM = "access"
ACCESS_NOTICE = "access.changed"


class AccessNotice(TypedDict):
    """The access stream's message (access_changed_publish)."""

    type: str
    user: int | None
    key: int | None


def labels_changed_publish(*, run_id: int, why: str) -> None:
    """Tell the run's pages that its labels' states may have moved (issue 64 item 1: "Where the
    labels went" stayed as it was for 8 minutes while labels trained): a train step consumed
    groups (`why` "trained"), a reward-model version recorded the labels it learned from
    ("reward_model"), a label was reviewed ("reviewed"), groups were dropped ("filtered"). Once
    the current transaction commits (the pages read what it wrote), at once outside one. Every
    place that shows the states asks for them again on it, as on feedback.saved and run.status."""
    from django.db import transaction

    transaction.on_commit(lambda: event_publish(run_id=run_id, type="labels.changed", payload={"why": why}))


def access_changed_publish(*, user_id: int | None = None, key_id: int | None = None) -> None:
    """Tell every web process that `user_id`'s access (or API key `key_id`) may have narrowed,
    once the current transaction commits (at once outside one). Never blocks long or raises:
    each process also re-checks its sockets every RFT_SOCKET_ACCESS_SECONDS, so a notice lost
    with Redis is late, not missed."""
    from django.db import transaction

    notice: AccessNotice = {"type": ACCESS_NOTICE, "user": user_id, "key": key_id}

    def send() -> None:
        layer = get_channel_layer()
        if layer is None:
            return
        future = asyncio.run_coroutine_threadsafe(layer.group_send(ACCESS_STREAM, dict(notice)), _publisher_loop())
        try:
            future.result(timeout=5)
        except Exception:  # the sweep catches up; a broken layer must not fail the change itself
            future.cancel()
            log.exception("access_changed_publish: could not tell the web processes about %s", notice)

    transaction.on_commit(send)


def runs_list_touch(*, run_id: int) -> None:
    """Tell the open runs lists that run `run_id` changed (its status, steps, buffer, people):
    at once if it has not told them within RUNS_LIST_NOTICE_SECONDS, else once at the end of
    that interval. Never blocks or raises: scheduled on the process's publisher loop."""
    if get_channel_layer() is None:
        return
    try:
        _publisher_loop().call_soon_threadsafe(_list_schedule, run_id)
    except RuntimeError:  # the loop is closing (interpreter shutdown)
        log.debug("runs_list_touch: no publisher loop for run %s", run_id)


# On the publisher loop only: runs with a notice waiting out its interval, the sends under
# way (which the exit flush waits for), and when each run's notice last went out.
_list_pending: set[int] = set()
_list_inflight: set[asyncio.Task[None]] = set()
_list_sent: dict[int, float] = {}


def _list_schedule(run_id: int) -> None:
    if run_id in _list_pending:
        return
    loop = asyncio.get_running_loop()
    _list_pending.add(run_id)
    wait = _list_sent.get(run_id, float("-inf")) + RUNS_LIST_NOTICE_SECONDS - loop.time()
    if wait <= 0:
        _list_start(run_id)
    else:
        loop.call_later(wait, _list_start, run_id)


def _list_start(run_id: int) -> None:
    """Send the run's waiting notice now (nothing if the exit flush has sent it already)."""
    if run_id not in _list_pending:
        return
    _list_pending.discard(run_id)
    loop = asyncio.get_running_loop()
    _list_sent[run_id] = loop.time()
    task = loop.create_task(_list_send(run_id))
    _list_inflight.add(task)
    task.add_done_callback(_list_inflight.discard)


async def _list_send(run_id: int) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        await layer.group_send(RUNS_LIST_STREAM, {"type": RUNS_LIST_NOTICE, "run": run_id})
    except Exception:  # a list that misses a notice still refreshes on reconnect
        log.exception("runs_list_touch: could not tell the runs lists about run %s", run_id)


def _flush_list_notices() -> None:
    """At exit, send the notices still waiting out their interval and wait for the sends
    under way: a short-lived process (a CLI command, a script) must not take the last change
    of a burst with it, nor leave a send to fail on a half torn-down interpreter (Redis's
    connect needs the executor that shutdown closes)."""
    if _publisher is None or not _publisher[1].is_alive():
        return

    async def flush() -> None:
        for run_id in list(_list_pending):
            _list_start(run_id)
        await asyncio.gather(*list(_list_inflight))

    try:
        asyncio.run_coroutine_threadsafe(flush(), _publisher[0]).result(timeout=5)
    except Exception:
        log.debug("runs_list_touch: could not flush the notices at exit", exc_info=True)


# Before the interpreter's thread shutdown, not at atexit: by then concurrent.futures has
# shut its executors, and Redis's connect (getaddrinfo on the loop's executor) fails with
# "cannot schedule new futures after shutdown". Thread-shutdown hooks run in reverse order of
# registration, so importing concurrent.futures.thread first puts ours ahead of its own.
import concurrent.futures.thread  # noqa: E402,F401

threading._register_atexit(_flush_list_notices)  # type: ignore[attr-defined]


def _forget_publisher_after_fork() -> None:
    # A forked child (Celery's prefork pool) has the parent's loop object but not its thread.
    global _publisher, _publisher_lock
    _publisher = None
    _publisher_lock = threading.Lock()
    _list_pending.clear()
    _list_inflight.clear()
    _list_sent.clear()


os.register_at_fork(after_in_child=_forget_publisher_after_fork)


async def event_publish_async(*, run_id: int, type: str, payload: Mapping[str, object]) -> None:
    message = _message(type, payload)
    layer = get_channel_layer()
    if layer is None:
        return
    if type not in _LIST_QUIET:
        runs_list_touch(run_id=run_id)
    try:
        await layer.group_send(run_stream_name(run_id), message)
    except Exception:
        log.exception("event_publish_async: could not send %s to run %s", type, run_id)
