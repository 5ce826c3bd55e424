"""Periodic housekeeping of the buffer, and a large upload's import off the request
(`taskset_import_queued` queues `taskset_import_task`)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from django.db import transaction

from apps.buffer.importers import taskset_import_background, taskset_import_claim
from apps.buffer.models import Taskset
from apps.buffer.pipeline import experience_priorities_refresh
from apps.buffer.services import lease_reap
from apps.runs.models import Run
from rftweb.taskkit import celery_task

if TYPE_CHECKING:
    from django.contrib.auth.models import User

log = logging.getLogger(__name__)


# Idempotent by nature (only expired leases move); cheap; never retried, the next beat runs it again.
@celery_task(name="apps.buffer.tasks.lease_reap_task", ignore_result=True, time_limit=60, soft_time_limit=50, acks_late=False)
def lease_reap_task() -> dict[str, int]:
    result = lease_reap()
    if result.experiences or result.task_attempts:
        log.info("lease_reap: %d experiences, %d task attempts back", result.experiences, result.task_attempts)
    return {"experiences": result.experiences, "task_attempts": result.task_attempts}


# Idempotent (recomputes priorities from stored fields); cheap enough to run every few
# minutes per active run; not retried: the next schedule runs it again.
@celery_task(
    name="apps.buffer.tasks.experience_priorities_refresh_task", ignore_result=True, time_limit=300,
    soft_time_limit=280, acks_late=False,
)
def experience_priorities_refresh_task(run_id: int) -> int:
    run = Run.objects.filter(pk=run_id).first()
    if run is None or run.status not in (Run.Status.RUNNING, Run.Status.PAUSED):
        return 0
    return experience_priorities_refresh(run=run)


# An upload past RFT_UPLOAD_BACKGROUND_BYTES, imported off the request. Takes the taskset's id;
# idempotent: the conditional-UPDATE claim on the taskset row lets one delivery import it
# (a redelivered or duplicate message finds it importing, ready or failed and does nothing),
# and a retry after a dead worker removes the earlier try's tasks first. Not retried: a bad
# file fails the same way each time, and its failure is kept on the taskset for the page.
# acks_late (the app's default) hands it back when its worker dies; the claim becomes free
# again once TASKSET_IMPORT_TIME_LIMIT has passed.
TASKSET_IMPORT_TIME_LIMIT = 3600


@celery_task(
    name="apps.buffer.tasks.taskset_import_task", ignore_result=True, time_limit=TASKSET_IMPORT_TIME_LIMIT,
    soft_time_limit=TASKSET_IMPORT_TIME_LIMIT - 60,
)
def taskset_import_task(taskset_id: int) -> str:
    if not taskset_import_claim(taskset_id=taskset_id, stale_seconds=TASKSET_IMPORT_TIME_LIMIT):
        return "taken"
    taskset = taskset_import_background(taskset_id=taskset_id)
    log.info("taskset %s import %s: %d rows %s", taskset_id, taskset.import_status, taskset.import_rows,
             taskset.import_error)
    return str(taskset.import_status)


def taskset_import_queued(*, name: str, stored: Path, owner: User | None = None) -> Taskset:
    """A taskset whose file (already stored under RFT_STORAGE_DIR/uploads) a Celery task
    imports once the caller's transaction commits (`taskset_import_task`, below)."""
    taskset = Taskset.objects.create(name=name, owner=owner, source=str(stored), import_status=Taskset.Import.QUEUED)
    transaction.on_commit(lambda: taskset_import_task.delay(taskset.pk))
    return taskset
