"""Housekeeping tasks of runs. The Celery app autodiscovers this module in every worker,
which also connects the heartbeat signal handlers (apps.runs.heartbeat)."""

from __future__ import annotations

from smtplib import SMTPException

from apps.buffer.selectors import buffer_counts
from apps.control.notifications import run_end_notify
from apps.runs import failures, heartbeat  # noqa: F401  (connect the worker signal handlers)
from apps.runs.events import event_publish
from apps.runs.models import Run
from rftweb.taskkit import celery_task


# Read-only and idempotent; a lost announcement is replaced by the next one, so no retries.
@celery_task(name="apps.control.tasks.run_announce", ignore_result=True, time_limit=30, soft_time_limit=25)
def run_announce(run_id: int) -> dict[str, int] | None:
    """Publish the run's buffer counts to its group (dashboards refresh from it)."""
    run = Run.objects.filter(pk=run_id).first()
    if run is None:
        return None
    counts = buffer_counts(run=run)
    event_publish(run_id=run_id, type="buffer.counts", payload=counts)
    return counts


# Idempotent on the end's key (apps/control/notifications.py): a retry or a second delivery
# makes no second notification and emails no one twice. An email backend that is down
# (SMTP or socket errors) is retried with backoff, 5 times over about a quarter of an hour.
@celery_task(name="apps.control.tasks.run_end_notify_task", ignore_result=True, time_limit=120, soft_time_limit=100,
             autoretry_for=(OSError, SMTPException), retry_backoff=30, retry_backoff_max=600, max_retries=5)
def run_end_notify_task(run_id: int, audit_id: int) -> int:
    """Tell the run's people it ended (in-app, and by email to those who want it)."""
    return run_end_notify(run_id=run_id, audit_id=audit_id)
