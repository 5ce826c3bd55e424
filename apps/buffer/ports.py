"""The buffer app's port to the workers: where a trainer takes its batches from
(`TrainSource`), where an explorer takes its tasks from (`TaskSource`) and puts what it made
(`ExperienceSink`), and the few reads of tasksets a worker does. Workers never touch the
buffer's models or managers; the rows handed out here are read, never saved, by them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from django.db import transaction
from django.db.models import Max

from apps.buffer.drafts import ExperienceDraft
from apps.buffer.images import image_open
from apps.buffer.models import Experience, Task, TaskAttempt, Taskset
from apps.buffer.pipeline.synthesize import paraphrase_accept
from apps.buffer.selectors import tasks_exhausted as _tasks_exhausted
from apps.buffer.services import (
    WriteResult,
    batch_claim,
    batch_commit_step,
    batch_release,
    experience_write,
    task_claim,
    task_finish,
    task_release,
)
from apps.runs.ports import RunView, row, train_step_recorded

# TaskAttempt and Experience: the rows TaskSource.claim and TrainSource.claim hand out, named by
# the explorer's and the trainer's annotations only.
__all__ = ["EXPLORER", "Experience", "ExperienceDraft", "ExperienceRecord", "ExperienceSink", "TaskAttempt", "TaskRecord", "TaskSource",
           "TrainSource", "WriteResult", "image_open", "paraphrase_accept", "paraphrases_add", "paraphrase_sources", "taskset_tasks",
           "tasks_exhausted"]

# The source an explorer's experiences carry.
EXPLORER = Experience.Source.EXPLORER.value


class TaskRecord(Protocol):
    """What a worker reads of a task (a prompt to sample, a reference to score against)."""

    @property
    def pk(self) -> int: ...
    @property
    def index(self) -> int: ...
    @property
    def prompt(self) -> str: ...
    @property
    def domain(self) -> str: ...


class ExperienceRecord(Protocol):
    """What a worker reads of an experience handed to it (workers.algorithms.rollout_from_experience
    reads the token fields too)."""

    @property
    def pk(self) -> int: ...
    @property
    def group_id(self) -> str: ...
    @property
    def prompt_text(self) -> str: ...
    @property
    def response_text(self) -> str: ...
    @property
    def metadata(self) -> Any: ...
    @property
    def task(self) -> TaskRecord | None: ...
    @property
    def model_version(self) -> int: ...
    @property
    def is_expert(self) -> bool: ...
    @property
    def human_reward(self) -> float | None: ...


class TrainSource:
    """A trainer's batches: leased (`claim`), then either trained on and acknowledged with the
    step (`commit`) or handed back untouched (`release`)."""

    @staticmethod
    def claim(*, run: RunView, worker: str, size: int, group_complete: bool = False, min_version: int | None = None,
              expert: bool | None = None) -> list[Experience]:
        return batch_claim(run=row(run), worker=worker, size=size, group_complete=group_complete,
                           min_version=min_version, expert=expert)

    @staticmethod
    def commit(*, run: RunView, step: int, worker: str, ids: Sequence[int], metrics: dict[str, float]) -> str | None:
        """Record `step` as the run's last, acknowledge its batch and store its metrics, in
        one transaction. None when done (the view's train_step is then `step`), else why
        not ("recorded by another trainer", "lease lost"), with nothing stored."""
        with transaction.atomic():
            why = batch_commit_step(run=row(run), step=step, worker=worker, ids=ids, metrics=metrics)
            if why is not None:
                transaction.set_rollback(True)
        if why is None:
            train_step_recorded(run, step)
        return why

    @staticmethod
    def release(*, run: RunView, worker: str, ids: Sequence[int] | None = None) -> int:
        return batch_release(run=row(run), worker=worker, ids=ids)


class TaskSource:
    """An explorer's tasks: leased attempts (each with its `task`), finished or handed back."""

    @staticmethod
    def claim(*, run: RunView, worker: str, size: int) -> list[TaskAttempt]:
        return task_claim(run=row(run), worker=worker, size=size)

    @staticmethod
    def release(*, run: RunView, worker: str, ids: Sequence[int] | None = None) -> int:
        return task_release(run=row(run), worker=worker, ids=ids)

    @staticmethod
    def finish(*, run: RunView, worker: str, ids: Sequence[int], model_version: int) -> int:
        return task_finish(run=row(run), worker=worker, ids=ids, model_version=model_version)


class ExperienceSink:
    @staticmethod
    def write(*, experiences: Sequence[ExperienceDraft], announce: bool = False) -> WriteResult:
        return experience_write(experiences=experiences, announce=announce)


def tasks_exhausted(*, run: RunView) -> bool:
    return _tasks_exhausted(run=row(run))


def taskset_tasks(*, taskset_id: int, limit: int) -> list[Task]:
    """The first `limit` tasks of a taskset, in order (an evaluation's)."""
    return list(Task.objects.filter(taskset_id=taskset_id).order_by("index")[:limit])


def paraphrase_sources(*, taskset_id: int, limit: int | None = None) -> list[Task]:
    """The taskset's unfiltered, non-synthetic tasks with a prompt not paraphrased yet."""
    done = set(
        Task.objects.filter(taskset_id=taskset_id, is_synthetic=True, metadata__synthetic="paraphrase")
        .values_list("metadata__synthetic_from", flat=True)
    )
    return [
        t for t in Task.objects.filter(taskset_id=taskset_id, is_synthetic=False, filter_reason="").order_by("index")
        if t.prompt and t.index not in done
    ][: limit or None]


def paraphrases_add(*, taskset_id: int, paraphrases: Sequence[tuple[Task, str]]) -> int:
    """Store (source task, paraphrased prompt) pairs as synthetic tasks after the taskset's
    last; returns how many."""
    new = [
        Task(taskset_id=taskset_id, prompt=text, reference=source.reference, tests=source.tests, domain=source.domain,
             metadata={**source.metadata, "synthetic": "paraphrase", "synthetic_from": source.index},
             is_synthetic=True)
        for source, text in paraphrases
    ]
    with transaction.atomic():
        # Lock the taskset so two workers do not hand out the same indices.
        Taskset.objects.select_for_update().filter(pk=taskset_id).first()
        start = (Task.objects.filter(taskset_id=taskset_id).aggregate(m=Max("index"))["m"] or 0) + 1
        for offset, task in enumerate(new):
            task.index = start + offset
        Task.objects.bulk_create(new)
    return len(new)
