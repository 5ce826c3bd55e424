"""Housekeeping tasks of runs. The Celery app autodiscovers this module in every worker,
which also connects the heartbeat signal handlers (apps.runs.heartbeat)."""

from __future__ import annotations

from celery import shared_task

from apps.buffer.selectors import buffer_counts
from apps.runs import failures, heartbeat  # noqa: F401  (connect the worker signal handlers)
from apps.runs.events import event_publish
from apps.runs.models import Run


# Read-only and idempotent; a lost announcement is replaced by the next one, so no retries.
@shared_task(name="apps.runs.tasks.run_announce", ignore_result=True, time_limit=30, soft_time_limit=25)
def run_announce(run_id: int) -> dict[str, int] | None:
    """Publish the run's buffer counts to its group (dashboards refresh from it)."""
    run = Run.objects.filter(pk=run_id).first()
    if run is None:
        return None
    counts = buffer_counts(run=run)
    event_publish(run_id=run_id, type="buffer.counts", payload=counts)
    return counts
