"""The Celery task `workers.trainer.task.train_step(run_id, step)` on queue `train`: acked late,
retried for transient database errors, a learner gang's lost rank shown on the run page and
the step sent again (once the run has trained a step), a failed weight sync sent again by the loop
(failing the run once it keeps failing), any other error fails the run with its message;
and the worker-start hook that imports the learner's libraries before the first step."""

from __future__ import annotations

import logging

from celery import Task, signals
from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.db import InterfaceError, OperationalError

from apps.runs.ports import run_view, task_failure_record
from rftweb.taskkit import celery_bound_task, on_signal
from workers.gang_lost import GangLost
from workers.weights.sync import SyncFailed
from workers.trainer.resident import resident_drop
from workers.trainer.step import StepConflict, StepOutcome, trainer_step, worker_name

log = logging.getLogger(__name__)


# The run page's name for a learner gang's lost rank: not one of the run's tasks
# (apps.runs.failures.RUN_TASKS), so shown there but never counted towards failing the run.
GANG_LOST_TASK = "learner gang"


def gang_lost(run_id: int, step: int, exc: GangLost) -> StepOutcome:
    """A learner gang lost a rank (or one did not come back in time) during a step that has
    trained before: nothing of the step was committed and its batch went back to the buffer
    (workers/trainer/step.py). The reason goes on the run page; the run keeps running and
    the loop sends the step again, which re-forms the gang once the host is back. At a run's
    first step the gang has never formed: that is a setup error, and the run fails with it."""
    view = run_view(run_id)
    if view is None or view.train_step <= 0:
        run_fail(run_id, step, exc)
        return {"status": "failed", "error": str(exc)}
    try:
        task_failure_record(run_id=run_id, task=GANG_LOST_TASK, step=step, worker=worker_name(), exception=exc)
    except Exception:
        log.exception("could not record run %s's lost learner rank", run_id)
    return {"status": "gang lost", "error": str(exc)}


def run_fail(run_id: int, step: int, exc: BaseException) -> None:
    """Record the failure for the run page and fail the run through run_transition."""
    try:
        task_failure_record(run_id=run_id, task="workers.trainer.task.train_step", step=step, worker=worker_name(),
                            exception=exc, fail_now=True)
    except Exception:
        log.exception("could not record the failure of run %s", run_id)


# Acked late (a worker that dies mid-step hands the message back); retried with backoff only
# for transient database errors; any other error fails the run with its message, since
# retrying a bad model path or a shape error would only repeat it. The soft limit releases
# the batch (the step is re-dispatched by the conductor).
@celery_bound_task(
    name="workers.trainer.task.train_step",
    acks_late=True,
    reject_on_worker_lost=True,
    time_limit=settings.RFT_TRAIN_TIME_LIMIT,
    soft_time_limit=max(1, settings.RFT_TRAIN_TIME_LIMIT - 60),
    autoretry_for=(OperationalError, InterfaceError),
    retry_backoff=2,
    retry_backoff_max=60,
    max_retries=5,
)
def train_step(self: Task, run_id: int, step: int) -> StepOutcome:
    try:
        return trainer_step(run_id=run_id, step=step, chain_seconds=settings.RFT_TRAIN_CHAIN_SECONDS,
                            task_id=self.request.id, node=self.request.hostname or "")
    except GangLost as exc:
        log.warning("run %s train step %s: %s", run_id, step, exc)
        resident_drop(run_id)  # lost after its step committed (publishing): the gang goes now
        return gang_lost(run_id, step, exc)
    except (OperationalError, InterfaceError, StepConflict, SoftTimeLimitExceeded) as exc:
        if isinstance(exc, StepConflict):
            return {"status": "conflict"}
        if isinstance(exc, SoftTimeLimitExceeded):
            return {"status": "timed out"}
        raise
    except SyncFailed as exc:
        # The step is recorded, its version is not out: the loop sends the step again and it
        # publishes (train_once). A fresh resident does it, rebuilt from the journal, since a
        # write a timeout left behind may still be reading this one's tensors. Counted as the
        # step's failure: one that keeps failing fails the run with this message.
        log.warning("run %s train step %s: %s", run_id, step, exc)
        resident_drop(run_id)
        try:
            task_failure_record(run_id=run_id, task="workers.trainer.task.train_step", step=step,
                                worker=worker_name(), exception=exc)
        except Exception:
            log.exception("could not record the failure of run %s", run_id)
        return {"status": "sync failed", "error": str(exc)}
    except Exception as exc:
        log.exception("run %s train step %s failed", run_id, step)
        run_fail(run_id, step, exc)
        return {"status": "failed", "error": str(exc)}


@on_signal(signals.worker_ready)
def _import_the_learner_at_start(sender: object = None, **_: object) -> None:
    """A worker that serves the train queue imports torch, transformers and TRL as it starts
    (tens of seconds on a busy CPU host) rather than inside its first step, where the time
    would count against the step and delay the run's first version."""
    queues = {q.name for q in getattr(getattr(sender, "task_consumer", None), "queues", [])}
    if "train" in queues:
        import workers.algorithms  # noqa: F401
