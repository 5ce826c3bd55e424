"""The runs app's port to the workers (workers/): what a GPU worker may read and record of
a run, and nothing else. Workers never touch `Run`, `ModelVersion` or their managers; they
hold a `RunView` and call the functions here, which wrap the app's selectors and services.

A `RunView` is frozen and read-only: a worker cannot change a run by assigning to it. What it
shows is the run as the ports last read or recorded it: recording a step or publishing a
version through a port moves it on (the view follows the row the ports keep for it), so a
trainer that chains steps sees its own progress without reading the run again, as it did
before the ports.

Pure helpers a worker needs of the kernel (the config type and its checks, the algorithm
registry, the run modes' schedule, the Dispatch claim) are re-exported here, so that one import
contract (pyproject.toml: "workers reach the apps through their ports") covers workers/.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings
from django.db import connection

from kernel.algorithms import PER_SEQUENCE_LOSS_TYPES, algorithm_get, algorithm_names
from kernel.config import RewardModelConfig, RunConfig, config_validate, learner_gang_refusal
from apps.runs.dispatch import DispatchHold, dispatch_claim
from apps.runs.failures import task_failure_record
from apps.runs.metrics import metric_record as _metric_record
from apps.runs.models import Dispatch, Metric, ModelVersion, Run
from apps.runs.schedule import explore_version, publishes_at, staleness, version_for_train_step
from kernel.reward_kinds import reward_kind_get
from apps.runs import services as _services
from kernel.model_dirs import model_dir_missing, model_missing_said
from kernel.preferences import preference_shares
from kernel.jsontypes import JSONObject

__all__ = [
    "PER_SEQUENCE_LOSS_TYPES", "DispatchHold", "DispatchJob", "DispatchState", "ENDED", "RUNNING", "RunConfig", "RunView",
    "RewardModelConfig", "VersionView", "advisory_lock", "reward_kind_get", "row", "train_step_recorded",
    "algorithm_get", "algorithm_names", "config_validate", "connection_release", "dispatch_claim",
    "eval_result_record", "explore_version", "learner_gang_refusal", "metric_exists", "metric_record", "model_dir_missing", "model_missing_said",
    "model_version_publish", "preference_shares", "publishes_at", "run_current_version", "run_ended", "run_explore_end",
    "run_explore_step_record", "run_explored", "run_status", "run_storage", "run_view", "run_view_of",
    "runs_ended", "staleness", "task_failure_record", "version_checkpoint", "version_for_train_step",
    "version_latest", "version_train_step", "weight_load_record", "sync_failure_record", "version_published_age",
]

DispatchJob = Dispatch.Job
DispatchState = Dispatch.State

RUNNING = Run.Status.RUNNING.value
# Statuses after which a run trains no more (a paused one may resume).
ENDED = (Run.Status.FINISHED.value, Run.Status.STOPPED.value, Run.Status.FAILED.value)


def run_storage(run_id: int) -> Path:
    """The run's directory on shared storage (versions, trainer state, graders)."""
    return Path(settings.RFT_STORAGE_DIR) / "runs" / str(run_id)


@dataclass(frozen=True)
class RunView:
    """What a worker needs of a run: its id, `config` (the validated RunConfig),
    `config_data` (the stored JSON it came from: a learner gang's followers and the resident
    policy's key get that), `config_digest` (its fingerprint: a rollout worker's cache key),
    `storage` (its directory on shared storage) and its progress. Only the id is fixed; the
    rest is the run as the ports last read or recorded it (a trainer that finds its next
    step due has the run read again, an edited config included)."""

    id: int
    # The row the ports read: theirs, not the worker's (it is how they record for the view).
    _row: Run = field(repr=False, compare=False)

    @property
    def config(self) -> RunConfig:
        return self._row.cfg

    @property
    def config_data(self) -> JSONObject:
        data: JSONObject = self._row.config
        return data

    @property
    def config_digest(self) -> str:
        return self._row.config_digest

    @property
    def storage(self) -> Path:
        return run_storage(self.id)

    @property
    def status(self) -> str:
        return str(self._row.status)

    @property
    def running(self) -> bool:
        return self._row.status == RUNNING

    @property
    def train_step(self) -> int:
        return int(self._row.train_step)

    @property
    def explore_step(self) -> int:
        return int(self._row.explore_step)

    @property
    def current_version(self) -> int:
        return int(self._row.current_version)


def run_view_of(run: Run) -> RunView:
    """The view of a row the web side (or a test) already holds."""
    return RunView(id=run.pk, _row=run)


def run_view(run_id: int) -> RunView | None:
    """The run as it is now (one query); None when there is no such run."""
    run = Run.objects.filter(pk=run_id).first()
    return run_view_of(run) if run is not None else None


def row(run: RunView) -> Run:
    """For the other apps' ports only: the row behind a view, to hand to their services."""
    return run._row


def run_status(run_id: int) -> str | None:
    return Run.objects.filter(pk=run_id).values_list("status", flat=True).first()


def run_current_version(run_id: int) -> int:
    return Run.objects.filter(pk=run_id).values_list("current_version", flat=True).first() or 0


def run_ended(run_id: int) -> bool:
    return Run.objects.filter(pk=run_id, status__in=ENDED).exists()


def runs_ended(run_ids: Collection[int]) -> set[int]:
    """Those of `run_ids` that have ended (one query)."""
    if not run_ids:
        return set()
    return set(Run.objects.filter(pk__in=list(run_ids), status__in=ENDED).values_list("pk", flat=True))


def run_explored(run_id: int, step: int) -> bool:
    """Whether explore step `step` (or a later one) is recorded."""
    return Run.objects.filter(pk=run_id, explore_step__gte=step).exists()


def run_explore_step_record(*, run: RunView, step: int) -> None:
    _services.run_explore_step_record(run=run._row, step=step)


def run_explore_end(*, run: RunView) -> bool:
    return _services.run_explore_end(run=run._row)


def train_step_recorded(run: RunView, step: int) -> None:
    """The trainer's step `step` committed (TrainSource.commit recorded it): the view moves on."""
    run._row.train_step = step


def version_checkpoint(*, run_id: int, number: int) -> str | None:
    return ModelVersion.objects.filter(run_id=run_id, number=number).values_list("checkpoint", flat=True).first()


def version_train_step(*, run_id: int, number: int) -> int | None:
    return ModelVersion.objects.filter(run_id=run_id, number=number).values_list("train_step", flat=True).first()


@dataclass(frozen=True)
class VersionView:
    number: int
    checkpoint: str
    train_step: int


def version_latest(*, run_id: int) -> VersionView | None:
    """The run's newest published version."""
    found = ModelVersion.objects.filter(run_id=run_id).order_by("-number").values_list(
        "number", "checkpoint", "train_step").first()
    return VersionView(*found) if found is not None else None


def model_version_publish(
    *, run: RunView, number: int, checkpoint: str, train_step: int = 0, seconds: float | None = None,
    size: int | None = None,
) -> None:
    """Record version `number` (apps.runs.services.model_version_publish); the view's
    current_version follows."""
    _services.model_version_publish(run=run._row, number=number, checkpoint=checkpoint, train_step=train_step,
                                    seconds=seconds, size=size)


def metric_record(*, run: RunView, step: int, values: dict[str, float]) -> None:
    _metric_record(run=run._row, step=step, values=values)


def metric_exists(*, run_id: int, step: int, name: str) -> bool:
    return Metric.objects.filter(run_id=run_id, step=step, name=name).exists()


def eval_result_record(*, run: RunView, version: int, step: int, values: dict[str, float]) -> int:
    return _services.eval_result_record(run=run._row, version=version, step=step, values=values)


def weight_load_record(
    *, run: RunView, version: int, worker: str, seconds: float, size: int | None = None, via: str | None = None
) -> None:
    _services.weight_load_record(run=run._row, version=version, worker=worker, seconds=seconds, size=size, via=via)


def sync_failure_record(*, run_id: int, version: int, method: str, stage: str, where: str, worker: str,
                        seconds: float, message: str) -> None:
    """A weight sync failed: on the run's weight-sync timeline (apps.runs.services.sync_failure_record)."""
    _services.sync_failure_record(run_id=run_id, version=version, method=method, stage=stage, where=where,
                                  worker=worker, seconds=seconds, message=message)


def version_published_age(*, run_id: int, number: int) -> float | None:
    """Seconds since version `number` of the run was published (None: it was not)."""
    from django.utils import timezone

    created = ModelVersion.objects.filter(run_id=run_id, number=number).values_list("created_at", flat=True).first()
    return (timezone.now() - created).total_seconds() if created is not None else None


def connection_release() -> None:
    """Close this thread's database connection (a worker's own thread, between passes)."""
    connection.close()


@contextmanager
def advisory_lock(namespace: int, key: int) -> Iterator[bool]:
    """A session-level Postgres advisory lock the database drops if the process dies; yields
    whether it was got."""
    with connection.cursor() as cur:
        cur.execute("SELECT pg_try_advisory_lock(%s, %s)", [namespace, key])
        got = bool(cur.fetchone()[0])
    try:
        yield got
    finally:
        if got:
            with connection.cursor() as cur:
                cur.execute("SELECT pg_advisory_unlock(%s, %s)", [namespace, key])
