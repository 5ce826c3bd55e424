"""A model version's weights as a download, web side (no torch).

What `rft weights RUN --version N --merged` writes (a full-weight version as it is, a LoRA
version folded into its base), zipped, for the run's members. Copying gigabytes, and merging
an adapter, which needs torch, are no work for a request: a member asks, the run's `export`
Dispatch row sends `workers.weights.download.weights_export_zip` to a train worker (the mechanism the
RFT core sends its steps with: a conditional UPDATE idle -> sent, so two clicks send one
task; a lost message or a dead worker is taken back and sent again), the worker writes the
zip under a temporary name and renames it into place, so a zip that is there is complete.

Where it stands is read from where it is true: the zip on the run's storage (ready), the
Dispatch row (queued while sent, packing while running) and the run's last `export`
TaskFailure for that version since it was asked for (failed, with the reason).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from django.conf import settings

from apps.control.conductor import dispatch_recover, dispatch_send
from apps.runs.models import Dispatch, ModelVersion, Run, TaskFailure
from kernel.exceptions import Conflict, NotFound, Unavailable

# TaskFailure.task of a failed pack (apps.runs.failures records it; it never fails the run).
EXPORT_FAILURE = "export"


def weights_zip_path(version: ModelVersion) -> Path:
    """Where the zip of a version lives on the run's storage (the worker writes it there).
    Named by the version's creation time too: a database made anew (tests, a restored
    backup) reuses run ids, and another run's zip must not stand for this one."""
    stamp = int(version.created_at.timestamp() * 1_000_000)
    return Path(settings.RFT_STORAGE_DIR) / "runs" / str(version.run_id) / "exports" / f"v{version.number}-{stamp}-weights.zip"


def weights_download_name(*, run_id: int, version: int) -> str:
    return f"run-{run_id}-v{version}-weights.zip"


@dataclass(frozen=True)
class WeightsExport:
    """Where a version's download stands: ready (with its size), being prepared (`stage`
    queued or packing), failed (`error`), or none of these (not asked for yet). `busy_with`
    names another version of the run being packed now (one at a time per run)."""

    version: int
    ready: bool = False
    size: int = 0
    stage: str = ""
    error: str = ""
    busy_with: int | None = None

    @property
    def preparing(self) -> bool:
        return bool(self.stage)


def _version(*, run: Run, version: int) -> ModelVersion:
    found = ModelVersion.objects.filter(run=run, number=version).first()
    if found is None or version == 0:
        raise NotFound(f"run {run.pk} has no trained version {version}", field="version")
    return found


def _export_state(*, run: Run, version: int, row: ModelVersion | None, out: Dispatch | None) -> WeightsExport:
    path = weights_zip_path(row) if row is not None else None
    if path is not None and path.is_file():
        return WeightsExport(version=version, ready=True, size=path.stat().st_size)
    if out is not None and out.state != Dispatch.State.IDLE:
        if out.step == version:
            return WeightsExport(version=version, stage="queued" if out.state == Dispatch.State.SENT else "packing")
        return WeightsExport(version=version, busy_with=out.step)
    asked: datetime | None = out.sent_at if out is not None and out.step == version else None
    failure = (TaskFailure.objects.filter(run=run, task=EXPORT_FAILURE, step=version).order_by("-created_at").first()
               if asked is not None else None)
    if failure is not None and asked is not None and failure.created_at >= asked:
        return WeightsExport(version=version, error=failure.message or failure.exception)
    return WeightsExport(version=version)


def weights_export_state(*, run: Run, version: int) -> WeightsExport:
    return _export_state(run=run, version=version, row=ModelVersion.objects.filter(run=run, number=version).first(),
                         out=Dispatch.objects.filter(run=run, job=Dispatch.Job.EXPORT).first())


def weights_export_states(*, run: Run, versions: list[ModelVersion]) -> dict[int, WeightsExport]:
    """weights_export_state of each of `versions` (trained ones of `run`), in two queries
    however many there are (the run page lists every version)."""
    if not versions:
        return {}
    out = Dispatch.objects.filter(run=run, job=Dispatch.Job.EXPORT).first()
    return {v.number: _export_state(run=run, version=v.number, row=v, out=out) for v in versions}


def weights_export_request(*, run: Run, version: int) -> WeightsExport:
    """Ask a train worker to pack `version` (idempotent: a packed or packing version is left
    as it is). A run's previous request that no worker took, or whose worker died, is taken
    back and sent again first (the RFT core's beat does that only for running runs)."""
    _version(run=run, version=version)
    dispatch_recover(run=run, jobs=(Dispatch.Job.EXPORT,))
    state = weights_export_state(run=run, version=version)
    if state.ready or state.preparing:
        return state
    if state.busy_with is not None:
        raise Conflict(f"the weights of v{state.busy_with} are being packed; ask for v{version} when they are ready",
                       field="version")
    try:
        sent = dispatch_send(run=run, job=Dispatch.Job.EXPORT, step=version)
    except Exception as exc:  # the broker is away: the row went back to idle
        raise Unavailable(f"the task queue cannot be reached ({type(exc).__name__}); try again in a moment") from None
    if not sent:
        # Another request got there first (this version or another): say which.
        state = weights_export_state(run=run, version=version)
        if state.busy_with is not None:
            raise Conflict(f"the weights of v{state.busy_with} are being packed; ask for v{version} when they are ready",
                           field="version")
        return state
    return weights_export_state(run=run, version=version)


def weights_zip_ready(*, run: Run, version: int) -> Path:
    """The packed zip of `version`; Conflict while it is not packed (yet)."""
    path = weights_zip_path(_version(run=run, version=version))
    if not path.is_file():
        raise Conflict(f"the weights of v{version} are not packed yet: ask for them on the run's summary "
                       "and wait for the link", field="version")
    return path
