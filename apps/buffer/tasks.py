"""Periodic housekeeping of the buffer."""

from __future__ import annotations

import logging

from celery import shared_task

from apps.buffer.services import lease_reap
from apps.runs.models import Run

log = logging.getLogger(__name__)


# Idempotent by nature (only expired leases move); cheap; never retried, the next beat runs it again.
@shared_task(name="apps.buffer.tasks.lease_reap_task", ignore_result=True, time_limit=60, soft_time_limit=50, acks_late=False)
def lease_reap_task() -> dict[str, int]:
    result = lease_reap()
    if result.experiences or result.task_attempts:
        log.info("lease_reap: %d experiences, %d task attempts back", result.experiences, result.task_attempts)
    return {"experiences": result.experiences, "task_attempts": result.task_attempts}


# Idempotent (recomputes priorities from stored fields); cheap enough to run every few
# minutes per active run; not retried: the next schedule runs it again.
@shared_task(
    name="apps.buffer.tasks.experience_priorities_refresh_task", ignore_result=True, time_limit=300,
    soft_time_limit=280, acks_late=False,
)
def experience_priorities_refresh_task(run_id: int) -> int:
    from apps.buffer.pipeline import experience_priorities_refresh

    run = Run.objects.filter(pk=run_id).first()
    if run is None or run.status not in (Run.Status.RUNNING, Run.Status.PAUSED):
        return 0
    return experience_priorities_refresh(run=run)
