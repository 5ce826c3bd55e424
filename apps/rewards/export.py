"""A reward-model version as a download, web side (no torch).

Exporting a version builds a directory `AutoModelForSequenceClassification` loads (a
`likelihood` version is rebuilt around its pinned base, which needs torch), so the web side
cannot do it in the request: the owner asks for it (page or API), a `reward` worker builds the
directory and packs it into one zip beside the version (`workers.reward_trainer
.reward_model_export_zip`), and the page offers the zip once it is there. The same export the
CLI writes (`rft reward-model RUN --out DIR`).

State lives where it is true: the zip on the run's storage (written atomically, so present
means complete), "preparing" and the last failure in Django's cache for as long as an export
may take.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from django.core.cache import cache
from django.db import transaction

from apps.rewards.models import RewardModel
from apps.runs.models import Run
from rftweb.exceptions import NotFound

EXPORT_TASK = "workers.reward_trainer.reward_model_export_zip"
# As long as the worker task may run (its time limit): past it, "preparing" is stale.
EXPORT_SECONDS = 1860


@dataclass(frozen=True)
class ExportState:
    """Where a version's download stands: `ready` (with its size), `preparing`, or neither
    (with the last failure's message, if the last try failed)."""

    ready: bool
    preparing: bool
    size: int = 0
    error: str = ""


def _identity(rm: RewardModel) -> str:
    # The id and the creation time: a database made anew (tests, a restored backup) reuses ids,
    # and a stale "preparing" of another version must not stand for this one.
    return f"{rm.pk}:{rm.created_at.timestamp():.6f}"


def preparing_key(rm: RewardModel) -> str:
    return f"rft:rm-export:{_identity(rm)}"


def error_key(rm: RewardModel) -> str:
    return f"rft:rm-export-error:{_identity(rm)}"


def export_zip_path(rm: RewardModel) -> Path:
    """The version's zip, beside its directory on the run's storage."""
    return Path(rm.path).with_name(f"{Path(rm.path).name}-export.zip")


def download_name(rm: RewardModel) -> str:
    return f"run-{rm.run_id}-reward-model-v{rm.version}.zip"


def export_states(versions: list[RewardModel]) -> dict[int, ExportState]:
    """Each version's state by version number, in one cache round trip."""
    keys = [k for rm in versions for k in (preparing_key(rm), error_key(rm))]
    flags = cache.get_many(keys) if keys else {}
    states = {}
    for rm in versions:
        path = export_zip_path(rm)
        size = path.stat().st_size if path.is_file() else -1
        states[rm.version] = ExportState(ready=size >= 0, size=max(size, 0),
                                         preparing=size < 0 and preparing_key(rm) in flags,
                                         error=str(flags.get(error_key(rm), "")))
    return states


def reward_model_version_get(*, run: Run, version: int) -> RewardModel:
    rm = RewardModel.objects.filter(run=run, version=version).first()
    if rm is None:
        raise NotFound(f"run {run.pk} has no reward model version {version}", field="version")
    return rm


def reward_model_export_request(*, run: Run, version: int) -> ExportState:
    """Ask a `reward` worker to pack `version` as a download, unless it is packed or being
    packed already (one task per version however often people click). Idempotent."""
    from rftweb.celery import app

    rm = reward_model_version_get(run=run, version=version)
    state = export_states([rm])[rm.version]
    if state.ready or state.preparing:
        return state
    if cache.add(preparing_key(rm), 1, EXPORT_SECONDS):
        cache.delete(error_key(rm))
        transaction.on_commit(lambda: app.send_task(EXPORT_TASK, args=[rm.pk], queue="reward"))
    return ExportState(ready=False, preparing=True)
