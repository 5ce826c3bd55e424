"""The Celery app: one queue per kind of work, routed to the hosts that can do it.

GPU workers serve `rollout` (the explorer) and `train` (the trainer); `reward` runs the
scorers that need a sandbox or a model; `default` runs housekeeping such as lease reaping.
"""

from __future__ import annotations

import math
import os
import time

from celery import Celery, signals
from kombu import Queue

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "rftweb.settings")
# A worker skips Django's system checks at its start. Celery's Django fix-up runs them all, and
# they load the URLconf and with it every view and the API: 0.5 CPU-s of each start, for a
# process that serves no URL. The web process and `migrate` (which runs before the web process
# and every worker: docker-compose.yml) run them.
os.environ.setdefault("CELERY_SKIP_CHECKS", "1")

from django.conf import settings

from rftweb.taskkit import on_signal

QUEUES = ("rollout", "train", "reward", "default")

app = Celery("rftweb")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.update(
    task_queues=[Queue(name) for name in QUEUES],
    task_default_queue="default",
    task_routes={
        "workers.explore.explorer.*": {"queue": "rollout"},
        "workers.explore.chat.*": {"queue": "rollout"},
        "workers.explore.evaluation.*": {"queue": "rollout"},
        "workers.explore.blind.*": {"queue": "rollout"},
        "workers.trainer.*": {"queue": "train"},
        "workers.reward.*": {"queue": "reward"},
        "workers.weights.*": {"queue": "train"},
    },
    # A task is acknowledged when it ends, so a worker that dies mid-task hands it back.
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    task_serializer="json",
    accept_content=["json"],
    # A hard ceiling only: tasks state their own limits, and a global soft limit above a
    # task's own hard limit would make Celery refuse to send that task.
    task_time_limit=3600,
    broker_connection_retry_on_startup=True,
    broker_transport_options={"visibility_timeout": 4 * 3600},
    worker_hijack_root_logger=False,
)


@on_signal(app.on_after_configure)
def _settings_config(sender: Celery, **_: object) -> None:
    """What comes from Django's settings, read when Celery first reads its configuration, not
    when this module is imported: a deployment's settings module that extends rftweb.settings
    (`from rftweb.settings import *`) imports this module half-way through its own import,
    when its values are not there yet."""
    sender.conf.update(
        # Celery falls back to Django's TIME_ZONE by itself, but through a lookup that tries each
        # namespaced name in turn, anew for every task message with an expiry (the OpenAI
        # endpoint's): ~0.07 ms a message, 0.01 ms when set here.
        timezone=settings.TIME_ZONE,
        beat_schedule={
            "lease-reap": {
                "task": "apps.buffer.tasks.lease_reap_task",
                "schedule": settings.RFT_LEASE_REAP_SECONDS,
            },
            # Feedback wait windows end in wall time; a beat every few seconds keeps the lag small.
            "feedback-wait-expire": {
                "task": "apps.feedback.tasks.feedback_wait_expire_task",
                "schedule": settings.RFT_FEEDBACK_EXPIRE_SECONDS,
            },
            "annotation-lease-reap": {
                "task": "apps.feedback.tasks.assignment_reap_task",
                "schedule": settings.RFT_LEASE_REAP_SECONDS,
            },
            # Agent sessions (OpenAI-compatible endpoint) nobody finished become abandoned.
            "agent-sessions-expire": {
                "task": "apps.envapi.tasks.agent_sessions_expire_task",
                "schedule": 60.0,
            },
            # The RFT core's loop (apps/control/conductor.py): every running run advanced. A
            # beat that waited in the queue longer than a few beats is dropped, not piled up.
            "conductor-beat": {
                "task": "apps.control.conductor_beat.conductor_beat_task",
                "schedule": settings.RFT_CONDUCT_SECONDS,
                "options": {"expires": max(5.0, 10 * settings.RFT_CONDUCT_SECONDS)},
            },
            # The learned reward model: retrain where labels came in, score what is unscored.
            "reward-model-beat": {
                "task": "apps.feedback.tasks.reward_model_beat_task",
                "schedule": settings.RFT_REWARD_MODEL_BEAT_SECONDS,
            },
        },
    )


app.autodiscover_tasks(["apps.runs", "apps.buffer", "apps.rewards", "apps.feedback", "apps.control", "apps.envapi"])
# Worker-side tasks, by the module that holds them; importing them loads no torch (models load
# inside the tasks), so every process knows every task by name. Their names are explicit and
# predate workers/ being arranged by role (round 63): "workers.explore.chat.chat" is defined in
# workers/explore/chat.py, and the routes above match the names, not the modules.
WORKER_TASK_MODULES = (
    "workers.explore.explorer", "workers.explore.chat", "workers.explore.evaluation", "workers.explore.blind", "workers.trainer.task", "workers.reward.scoring",
    "workers.explore.synthesize", "workers.reward.trainer", "workers.weights.download",
)
for _package, _, _module in (name.rpartition(".") for name in WORKER_TASK_MODULES):
    app.autodiscover_tasks([_package], related_name=_module)
# The RFT core's loop (apps/control/conductor_beat.py).
app.autodiscover_tasks(["apps.control"], related_name="conductor_beat")


@on_signal(signals.worker_init, signals.worker_process_init)
def _keep_database_connections(**_: object) -> None:
    """Worker processes reuse their database connection across tasks for
    RFT_WORKER_CONN_MAX_AGE seconds, checked before each reuse (see the settings)."""
    from django.conf import settings

    from django.db import connections

    max_age = settings.RFT_WORKER_CONN_MAX_AGE
    if max_age > 0:
        for alias, database in settings.DATABASES.items():
            # The web process's pool is not for workers: one kept connection each (a pool
            # refuses CONN_MAX_AGE > 0).
            options = database.get("OPTIONS")
            if isinstance(options, dict) and "pool" in options:
                connection = connections[alias]
                connection.close()
                connection.close_pool()  # type: ignore[attr-defined]  # postgresql's wrapper
                del options["pool"]
            database["CONN_MAX_AGE"] = max_age
            database["CONN_HEALTH_CHECKS"] = True


_last_task_end = [-math.inf]  # time.monotonic() when this process's last task ended


def _close_old_connections(sender: object = None, *, ending: bool) -> None:
    # What Django does around each request: drop a connection that is broken, in a failed
    # transaction or older than its max age; keep the rest. Eager tasks run inside the
    # caller's request or test, whose connection is not ours to close.
    from django.conf import settings
    from django.db import close_old_connections, connections

    if settings.RFT_WORKER_CONN_MAX_AGE <= 0 or getattr(getattr(sender, "request", None), "is_eager", False):
        return
    close_old_connections()
    now = time.monotonic()
    if ending:
        _last_task_end[0] = now
    elif now - _last_task_end[0] < settings.RFT_WORKER_HEALTH_CHECK_IDLE_SECONDS:
        # Django would check each kept connection with a round trip before its first query
        # (CONN_HEALTH_CHECKS); the last task ended a moment ago, with its connections working
        # (one that errored was checked, or dropped, just above).
        for conn in connections.all(initialized_only=True):
            if conn.connection is not None:
                conn.health_check_done = True  # type: ignore[attr-defined]  # Django sets it; the stubs lag


@on_signal(signals.task_prerun)
def _connections_before_task(sender: object = None, **_: object) -> None:
    _close_old_connections(sender, ending=False)


@on_signal(signals.task_postrun)
def _connections_after_task(sender: object = None, **_: object) -> None:
    _close_old_connections(sender, ending=True)
