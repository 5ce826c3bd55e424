"""What the two evaluation tasks share (the held-out evaluation, `evaluation.evaluate`, and
the blind evaluation's answers, `blind.answers_generate`): the same Celery options and the
same rule for failures.

Database hiccups retry (Celery's autoretry); anything else is handed to the task's own
`on_failure` (which logs it, and records it where a page shows it) and dropped: a failed
evaluation must never stop the run's own work on the rollout queue.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from django.db import OperationalError

R = TypeVar("R")

# Late acks: a worker lost mid-evaluation leaves the message for another (both tasks are
# idempotent). The limits leave a long evaluation room and stop a stuck one.
EVALUATION_TASK_OPTIONS: dict[str, object] = {
    "acks_late": True,
    "soft_time_limit": 1500,
    "time_limit": 1800,
    "autoretry_for": (OperationalError,),
    "retry_backoff": True,
    "max_retries": 3,
}


def failure_dropped(work: Callable[[], R], on_failure: Callable[[str], R]) -> R:
    """`work()`, or, when it raises anything but a database error, `on_failure` of the error
    as "Type: message" (called inside the handler, so `log.exception` sees the traceback)."""
    try:
        return work()
    except OperationalError:
        raise
    except Exception as exc:
        return on_failure(f"{type(exc).__name__}: {exc}")
