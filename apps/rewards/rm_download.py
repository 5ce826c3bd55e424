"""A reward-model version as a download, web side (no torch).

Exporting a version builds a directory `AutoModelForSequenceClassification` loads (a
`likelihood` version is rebuilt around its pinned base, which needs torch), so the web side
cannot do it in the request: the owner asks for it (page or API), a `reward` worker builds the
directory and packs it into one zip beside the version (`workers.reward.trainer
.reward_model_export_zip`), and the page offers the zip once it is there. The same export the
CLI writes (`rft reward-model RUN --out DIR`).

State lives where it is true: the zip on the run's storage (written atomically, so present
means complete), "preparing" and the last failure on the version's `rm_export` dispatch row
(apps/runs/dispatch.py, the project's one scheduling mechanism), held for at most as long as
an export may take. "Preparing" has two stages, so a request no worker takes is not shown as
work under way for half an hour: `queued` (the row sent) from the request until a reward
worker starts on it, then `packing` (running). A request queued longer than
`REQUEUE_SECONDS` (no reward worker running, or the broker lost the message) says so and may
be asked again; one packing at a time per version, and a second one later is harmless (each
writes its own temporary zip and renames it into place).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from apps.rewards.models import RewardModel
from apps.runs.dispatch import DispatchHold, dispatch_claim, dispatch_free
from apps.runs.models import Dispatch, Run
from kernel.exceptions import NotFound
from rftweb.celery import app

EXPORT_TASK = "workers.reward.trainer.reward_model_export_zip"
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


def export_key(rm: RewardModel) -> str:
    """The key of the version's `rm_export` dispatch row within its run."""
    return f"v{rm.version}"


def export_zip_path(rm: RewardModel) -> Path:
    """The version's zip, beside its directory on the run's storage."""
    return Path(rm.path).with_name(f"{Path(rm.path).name}-export.zip")


def download_name(rm: RewardModel) -> str:
    return f"run-{rm.run_id}-reward-model-v{rm.version}.zip"


def export_states(versions: list[RewardModel]) -> dict[int, ExportState]:
    """Each version's state by version number, in one query."""
    rows = {
        (d.run_id, d.key): d
        for d in Dispatch.objects.filter(job=Dispatch.Job.RM_EXPORT, run_id__in={rm.run_id for rm in versions},
                                         key__in=[export_key(rm) for rm in versions])
    } if versions else {}
    now = timezone.now()
    states = {}
    for rm in versions:
        path = export_zip_path(rm)
        size = path.stat().st_size if path.is_file() else -1
        row = rows.get((rm.run_id, export_key(rm)))
        # Held: sent or running under a lease that has not run out (past it, its job crashed).
        held = row is not None and row.state != Dispatch.State.IDLE and (row.expires_at is None or row.expires_at >= now)
        states[rm.version] = ExportState(ready=size >= 0, size=max(size, 0), preparing=size < 0 and held,
                                         packing=held and row is not None and row.state == Dispatch.State.RUNNING,
                                         since=row.sent_at.timestamp() if row is not None and row.sent_at else None,
                                         error=row.error if row is not None and not held else "")
    return states


def export_begin(*, rm: RewardModel, task_id: str | None) -> DispatchHold | None:
    """A reward worker starts packing `rm` (the page: no longer just queued); None while
    another packs it. The hold's end keeps the failure, if any, for the page."""
    now = timezone.now()
    return dispatch_claim(run_id=rm.run_id, job=Dispatch.Job.RM_EXPORT, key=export_key(rm),
                          state=Dispatch.State.RUNNING, when=dispatch_free(now) | Q(state=Dispatch.State.SENT),
                          task_id=task_id, lease_seconds=EXPORT_SECONDS)


def reward_model_version_get(*, run: Run, version: int) -> RewardModel:
    rm = RewardModel.objects.filter(run=run, version=version).first()
    if rm is None:
        raise NotFound(f"run {run.pk} has no reward model version {version}", field="version")
    return rm


def reward_model_export_request(*, run: Run, version: int) -> ExportState:
    """Ask a `reward` worker to pack `version` as a download, unless it is packed or being
    packed already (one task per version however often people click), or queued so long that
    no worker may be there to take it (`ExportState.stalled`): then it is sent again."""
    rm = reward_model_version_get(run=run, version=version)
    state = export_states([rm])[rm.version]
    if state.ready or (state.preparing and not state.stalled):
        return state
    now = timezone.now()
    # Free, or queued so long that no worker is taking it: of two requests at once, one sends.
    stale = Q(state=Dispatch.State.SENT, sent_at__lt=now - timedelta(seconds=REQUEUE_SECONDS))
    hold = dispatch_claim(run_id=rm.run_id, job=Dispatch.Job.RM_EXPORT, key=export_key(rm),
                          state=Dispatch.State.SENT, when=dispatch_free(now) | stale, lease_seconds=EXPORT_SECONDS)
    if hold is None:
        return export_states([rm])[rm.version]  # another request got there first
    task_id = hold.task_id
    transaction.on_commit(lambda: app.send_task(EXPORT_TASK, args=[rm.pk], queue="reward", task_id=task_id))
    return ExportState(ready=False, preparing=True, since=now.timestamp())
