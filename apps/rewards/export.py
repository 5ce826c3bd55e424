"""A reward-model version as a download, web side (no torch).

Exporting a version builds a directory `AutoModelForSequenceClassification` loads (a
`likelihood` version is rebuilt around its pinned base, which needs torch), so the web side
cannot do it in the request: the owner asks for it (page or API), a `reward` worker builds the
directory and packs it into one zip beside the version (`workers.reward_trainer
.reward_model_export_zip`), and the page offers the zip once it is there. The same export the
CLI writes (`rft reward-model RUN --out DIR`).

State lives where it is true: the zip on the run's storage (written atomically, so present
means complete), "preparing" and the last failure in Django's cache for as long as an export
may take. "Preparing" has two stages, so a request no worker takes is not shown as work under
way for half an hour: `queued` from the request until a reward worker starts on it, then
`packing`. A request queued longer than `REQUEUE_SECONDS` (no reward worker running, or the
broker lost the message) says so and may be asked again; a second packing of the same
version is harmless (each writes its own temporary zip and renames it into place).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.core.cache import cache
from django.db import transaction

from apps.rewards.models import RewardModel
from apps.runs.models import Run
from rftweb.exceptions import NotFound

EXPORT_TASK = "workers.reward_trainer.reward_model_export_zip"
# As long as the worker task may run (its time limit): past it, "preparing" is stale.
EXPORT_SECONDS = 1860
# A request no reward worker has started on for this long may be asked again (a reward worker
# may be busy training the run's next version first: minutes, not tens of them).
REQUEUE_SECONDS = 600


@dataclass(frozen=True)
class ExportState:
    """Where a version's download stands: `ready` (with its size), `preparing`, or neither
    (with the last failure's message, if the last try failed)."""

    ready: bool
    preparing: bool
    size: int = 0
    error: str = ""
    # While preparing: has a worker started (packing) or is it still queued, and since when.
    packing: bool = False
    since: float | None = None

    @property
    def stalled(self) -> bool:
        """Queued for longer than a reward worker needs to get to it: none may be running."""
        return (self.preparing and not self.packing and self.since is not None
                and time.time() - self.since > REQUEUE_SECONDS)

    @property
    def stage(self) -> str:
        """While preparing: queued, packing or stalled; else empty (the page and the API)."""
        if not self.preparing:
            return ""
        return "packing" if self.packing else "stalled" if self.stalled else "queued"

    @property
    def waited_minutes(self) -> int:
        return int((time.time() - self.since) // 60) if self.since is not None else 0


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


def stage_mark(stage: str, at: float | None = None) -> dict[str, Any]:
    """The cache value of a preparing version: its stage and when it entered it (now)."""
    return {"stage": stage, "at": time.time() if at is None else at}


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
        mark = flags.get(preparing_key(rm))
        stage: dict[str, Any] = mark if isinstance(mark, dict) else {"stage": "packing"}  # a bare flag: older code's
        at = stage.get("at")
        states[rm.version] = ExportState(ready=size >= 0, size=max(size, 0),
                                         preparing=size < 0 and mark is not None,
                                         packing=stage.get("stage") == "packing",
                                         since=float(at) if isinstance(at, int | float) else None,
                                         error=str(flags.get(error_key(rm), "")))
    return states


def reward_model_version_get(*, run: Run, version: int) -> RewardModel:
    rm = RewardModel.objects.filter(run=run, version=version).first()
    if rm is None:
        raise NotFound(f"run {run.pk} has no reward model version {version}", field="version")
    return rm


def reward_model_export_request(*, run: Run, version: int) -> ExportState:
    """Ask a `reward` worker to pack `version` as a download, unless it is packed or being
    packed already (one task per version however often people click), or queued so long that
    no worker may be there to take it (`ExportState.stalled`): then it is sent again."""
    from rftweb.celery import app

    rm = reward_model_version_get(run=run, version=version)
    state = export_states([rm])[rm.version]
    if state.ready or (state.preparing and not state.stalled):
        return state
    mark = stage_mark("queued")
    if state.stalled:
        cache.set(preparing_key(rm), mark, EXPORT_SECONDS)
        sent = True
    else:
        sent = cache.add(preparing_key(rm), mark, EXPORT_SECONDS)
    if sent:
        cache.delete(error_key(rm))
        transaction.on_commit(lambda: app.send_task(EXPORT_TASK, args=[rm.pk], queue="reward"))
        return ExportState(ready=False, preparing=True, since=mark["at"])
    return export_states([rm])[rm.version]  # another request got there first
