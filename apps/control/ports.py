"""The control plane's port to the workers: a task's hold on its run's dispatch row, the
trainer's per-run lock, what the next train step needs (its batch plan and readiness), the
loop's nudge after a step, an explore step's one write, and where a version's weights zip
goes. Workers hold a `RunView`; the rows stay here.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from django.db import transaction

from apps.buffer.ports import ExperienceDraft, ExperienceSink, TaskSource, WriteResult
from apps.control import conductor as _conductor
from apps.control.conductor import EXPORT_TASK, TrainReadiness, batch_plan, dispatch_begin
from apps.control.weights import EXPORT_FAILURE
from apps.control.weights import weights_zip_path as _weights_zip_path
from apps.rewards.ports import rewards_remote_enqueue
from apps.runs.models import ModelVersion
from apps.runs.ports import RunView, advisory_lock, row, run_explore_step_record

__all__ = ["EXPORT_FAILURE", "EXPORT_TASK", "BatchPlan", "TrainReadiness", "WeightsExport", "batch_plan",
           "dispatch_begin", "explore_step_write", "run_advance_after_step", "train_readiness",
           "train_step_continue", "trainer_lock", "weights_export_of"]


@contextmanager
def trainer_lock(run_id: int) -> Iterator[bool]:
    """One trainer per run: a session-level advisory lock the database drops if the trainer
    dies (the loop reads it to tell a live trainer from a dead one); yields whether got."""
    with advisory_lock(_conductor.TRAINER_LOCK_NAMESPACE, run_id) as got:
        yield got


def train_readiness(*, run: RunView) -> TrainReadiness:
    return _conductor.train_readiness(run=row(run))


def train_step_continue(*, run: RunView, step: int) -> TrainReadiness | None:
    """Whether a trainer goes on with `step` itself (the run is read again first)."""
    return _conductor.train_step_continue(run=row(run), step=step)


def run_advance_after_step(*, run: RunView, train: bool = True) -> None:
    _conductor.run_advance_after_step(run=row(run), train=train)


def explore_step_write(
    *, run: RunView, step: int, worker: str, drafts: Sequence[ExperienceDraft], attempt_ids: Sequence[int],
    model_version: int,
) -> WriteResult | None:
    """An explore step's outcome, in one transaction: its experiences, its task attempts
    finished, the step recorded, and remote scoring queued for the new ones awaiting it.

    None, and nothing written, when the step's attempts were taken back while it generated
    (the loop judged its worker dead and handed them back to the queue). Recorded anyway, the
    step was done while its attempts stayed open: the next step claimed them again, found
    every experience a duplicate, and the trainer waited for a batch that never came."""
    with transaction.atomic():
        # The attempts first: a step that lost them writes nothing.
        finished = TaskSource.finish(run=run, worker=worker, ids=attempt_ids, model_version=model_version)
        if finished != len(set(attempt_ids)):
            transaction.set_rollback(True)
            return None
        written = ExperienceSink.write(experiences=drafts, announce=True)
        run_explore_step_record(run=run, step=step)
        rewards_remote_enqueue(run_id=run.id, experience_ids=[
            pk for pk, draft, new in zip(written.ids, drafts, written.is_new)
            if new and draft.metadata.get("awaiting_rewards")
        ])
    return written


@dataclass(frozen=True)
class WeightsExport:
    checkpoint: str
    target: Path


def weights_export_of(*, run_id: int, version: int) -> WeightsExport | None:
    """Where version `version`'s weights are and where their zip goes; None: no such version."""
    found = ModelVersion.objects.filter(run_id=run_id, number=version).first()
    if found is None:
        return None
    return WeightsExport(checkpoint=found.checkpoint, target=_weights_zip_path(found))
