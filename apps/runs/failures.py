"""Failures of a run's tasks: recorded for the run page's worker-errors panel, and a run
whose steps keep failing goes to `failed` with the reason instead of `running` forever.

A failure counts as "in a row" when the run has made no progress (explore_step +
train_step) since the previous one and since it was last started or resumed; after
`RFT_RUN_FAIL_AFTER` of them the run fails. One bad step that a retry gets past does not.

The Celery `task_failure` handler is connected when this module is imported; apps.control.tasks
imports it, and the Celery app autodiscovers that module in every worker.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import signals
from django.conf import settings

from apps.runs.events import event_publish
from apps.runs.models import AuditEntry, Run, TaskFailure
from apps.runs.services import TransitionNotAllowed, run_transition
from rftweb.taskkit import on_signal

log = logging.getLogger(__name__)

# The tasks that work for one run, with (run_id, step) as their arguments.
RUN_TASKS = {"workers.explore.explorer.explore_step": "explore", "workers.trainer.task.train_step": "train"}


def _short(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def task_failure_record(*, run_id: int, task: str, step: int | None, worker: str, exception: BaseException | str,
                        fail_now: bool = False) -> TaskFailure | None:
    """Store one failure of a run's task, announce it, and fail the run when its steps keep
    failing (or at once with `fail_now`, for errors a retry would only repeat)."""
    run = Run.objects.filter(pk=run_id).first()
    if run is None:
        return None
    name = type(exception).__name__ if isinstance(exception, BaseException) else "Error"
    message = _short(str(exception), 4000)
    progress = run.explore_step + run.train_step
    failure = TaskFailure.objects.create(run=run, task=RUN_TASKS.get(task, task), step=step, worker=_short(worker, 200),
                                         exception=_short(name, 200), message=message, progress=progress)
    event_publish(run_id=run.pk, type="worker.error", payload={
        "task": failure.task, "step": step, "worker": failure.worker, "exception": failure.exception,
        "message": _short(message, 500), "at": failure.created_at.isoformat(),
    })
    if failure.task not in RUN_TASKS.values():
        return failure  # a side job (a weights download): shown, never held against the run
    started = (AuditEntry.objects.filter(run=run, action__in=("start", "resume")).order_by("-created_at")
               .values_list("created_at", flat=True).first())
    in_a_row = TaskFailure.objects.filter(run=run, progress=progress, task__in=RUN_TASKS.values())
    if started is not None:
        in_a_row = in_a_row.filter(created_at__gte=started)
    count = in_a_row.count()
    if run.status == Run.Status.RUNNING and (fail_now or count >= settings.RFT_RUN_FAIL_AFTER):
        where = f"{failure.task} step {step}" if step is not None else failure.task
        times = "" if fail_now else f" failed {count} times in a row;"
        reason = f"{where}{times} {name}: {_short(message, 1000)}".replace(";  ", "; ")
        try:
            run_transition(run=run, action="fail", reason=reason)
        except TransitionNotAllowed:
            pass  # stopped or paused meanwhile: the person's choice stands
    return failure


@on_signal(signals.task_failure)
def _on_task_failure(sender: object = None, exception: BaseException | None = None, args: Any = None, **_: object) -> None:
    name = getattr(sender, "name", "")
    if name not in RUN_TASKS or not args:
        return
    try:
        run_id = int(args[0])
        step = int(args[1]) if len(args) > 1 else None
        worker = getattr(getattr(sender, "request", None), "hostname", "") or ""
        task_failure_record(run_id=run_id, task=name, step=step, worker=worker, exception=exception or "failed")
    except Exception:  # recording a failure must never hide the failure itself
        log.exception("could not record the failure of %s%s", name, args)
