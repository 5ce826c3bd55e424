"""A model version's weights packed as the run summary's download (apps/control/weights.py).

`weights_export_zip` writes what `rft weights RUN --version N --merged` writes (a full-weight
version copied, a LoRA version folded into its base: a directory AutoModelForCausalLM loads)
and zips it, stored (weights do not compress), under a temporary name renamed into place.

Task policy: queue `train` (torch and peft live there), sent through the run's `export`
Dispatch row and run only while that row names its message (a duplicate does nothing);
acknowledged late, idempotent (a zip that is there is complete and is kept); a failure is
recorded as the run's `export` TaskFailure for the summary to show, never retried by itself
(someone asks again); database hiccups retry with backoff; soft limit 30 min. torch is
imported inside the functions only (every process imports this module to know the task).
"""

from __future__ import annotations

import logging
import os
import tempfile
import zipfile
from pathlib import Path

from celery import Task
from django.db import InterfaceError, OperationalError

from apps.control.ports import EXPORT_FAILURE, EXPORT_TASK, dispatch_begin, weights_export_of
from apps.runs.ports import DispatchJob, task_failure_record
from rftweb.taskkit import celery_bound_task
from workers.weights.adapters import model_export

log = logging.getLogger(__name__)


def weights_zip_write(*, source: str, target: Path) -> Path:
    """Export the version at `source` (workers.weights.adapters.model_export, merged) into a
    temporary directory beside `target` and zip it into place."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="weights-export-", dir=target.parent) as tmp:
        out = model_export(source=source, out=Path(tmp) / "model", merged=True)
        partial = Path(tmp) / "export.zip"
        with zipfile.ZipFile(partial, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as archive:
            for file in sorted(p for p in out.rglob("*") if p.is_file()):
                archive.write(file, arcname=str(file.relative_to(out)))
        os.replace(partial, target)
    return target


@celery_bound_task(
    name=EXPORT_TASK, acks_late=True, reject_on_worker_lost=True, soft_time_limit=1800, time_limit=1860,
    autoretry_for=(OperationalError, InterfaceError), retry_backoff=True, max_retries=5, ignore_result=True,
)
def weights_export_zip(self: Task, run_id: int, version: int) -> dict[str, object]:
    node = self.request.hostname or "export"
    hold = dispatch_begin(run_id=run_id, job=DispatchJob.EXPORT, step=version, task_id=self.request.id,
                          worker=node, holder=node)
    if hold is None:
        return {"run": run_id, "version": version, "skipped": "another request holds the run's export"}
    try:
        row = weights_export_of(run_id=run_id, version=version)
        if row is None:
            return {"run": run_id, "version": version, "skipped": "no such version"}
        target = row.target
        if target.is_file():
            return {"run": run_id, "version": version, "zip": str(target)}
        try:
            weights_zip_write(source=row.checkpoint, target=target)
        except (ValueError, OSError) as exc:  # ExportFailed (a ValueError): the checkpoint is gone or unreadable
            log.warning("run %s v%s: weights export failed: %s", run_id, version, exc)
            task_failure_record(run_id=run_id, task=EXPORT_FAILURE, step=version, worker=node, exception=exc)
            return {"run": run_id, "version": version, "error": str(exc)}
        return {"run": run_id, "version": version, "zip": str(target), "bytes": target.stat().st_size}
    finally:
        hold.end()
