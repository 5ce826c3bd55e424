"""The trainer's state on shared storage: per step a journal entry (the exact batch and the
RNG state the step starts from, written and fsynced before the step commits) and, every
`RFT_TRAINER_SNAPSHOT_STEPS` steps and at the last step, a full snapshot (weights, optimizer,
scheduler) after which the journal entries and older snapshots it covers go. A restart
(workers/trainer/resident.py) rebuilds the policy from the newest snapshot and the journal.
See the package's docstring (workers/trainer/__init__.py) for why a journal."""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, NotRequired, Protocol, TypedDict

from django.conf import settings
from workers.weights.sync import run_storage

if TYPE_CHECKING:
    import torch

    from workers.algorithms.batch import Rollout, TrainBatch
    from workers.algorithms.gang import LearnerGang
    from workers.algorithms.learner import Learner

log = logging.getLogger(__name__)


def trainer_dir(run_id: int) -> Path:
    return run_storage(run_id) / "trainer"


def state_dir(run_id: int, step: int) -> Path:
    """The full snapshot after step `step` (a save_pretrained directory plus optimizer.pt),
    present only for snapshot steps (`snapshot_due`) until a newer snapshot replaces it."""
    return trainer_dir(run_id) / f"step-{step}"


def journal_path(run_id: int, step: int) -> Path:
    return trainer_dir(run_id) / "journal" / f"step-{step}.json"


def snapshot_due(*, step: int, total_steps: int) -> bool:
    every = max(1, int(settings.RFT_TRAINER_SNAPSHOT_STEPS))
    return step % every == 0 or step >= total_steps


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class RngState(TypedDict):
    """The RNG state a step starts from, each generator's bytes in base64."""

    cpu: str
    # One per CUDA device, where CUDA is in use.
    cuda: NotRequired[list[str]]


def rng_state() -> RngState:
    import torch

    def enc(t: torch.Tensor) -> str:
        return base64.b64encode(t.numpy().tobytes()).decode("ascii")

    state: RngState = {"cpu": enc(torch.get_rng_state())}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = [enc(t.cpu()) for t in torch.cuda.get_rng_state_all()]
    return state


def rng_restore(state: RngState) -> None:
    import torch

    def dec(text: str) -> torch.Tensor:
        return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8)

    torch.set_rng_state(dec(state["cpu"]))
    if state.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([dec(t) for t in state["cuda"]])


def journal_encode(*, step: int, batch: TrainBatch, batch_ids: list[int], rng: RngState) -> bytes:
    """What step `step` trains on: the batch as trained (not ids: the buffer's rewards and
    feedback may change later) and the RNG state the step starts from. Shallow field reads
    and one C-level json.dumps (dataclasses.asdict deep-copies: ms more per step)."""

    def rollout(r: Rollout) -> dict[str, object]:
        return {f.name: getattr(r, f.name) for f in dataclasses.fields(r)}

    entry = {
        "step": step,
        "batch_ids": batch_ids,
        "usual": [rollout(r) for r in batch.usual],
        "expert": [rollout(r) for r in batch.expert],
        "preferences": [list(p) for p in batch.preferences],
        "rng": rng,
    }
    return json.dumps(entry).encode()


def journal_store(*, run_id: int, step: int, data: bytes) -> Path:
    """Write an encoded entry durably (fsynced file, atomic rename, fsynced directory); it
    replaces the entry of an earlier attempt at this step, which never committed."""
    out = journal_path(run_id, step)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.{os.getpid()}"
    with tmp.open("wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, out)
    _fsync_path(out.parent)
    return out


def journal_read(path: Path) -> tuple[TrainBatch, RngState]:
    """A journal entry's batch and the RNG state its step started from."""
    return journal_decode(path.read_bytes())


def journal_decode(data: bytes) -> tuple[TrainBatch, RngState]:
    """What journal_encode wrote: (the batch, the RNG state)."""
    from workers.algorithms import Rollout, TrainBatch

    entry = json.loads(data)
    batch = TrainBatch(
        usual=[Rollout(**r) for r in entry["usual"]],
        expert=[Rollout(**r) for r in entry["expert"]],
        preferences=[(int(w), int(l)) for w, l in entry["preferences"]],
    )
    return batch, entry["rng"]


class Snapshotted(Protocol):
    """What a snapshot is written from: the train worker's resident learner (resident.py's
    `Resident`), named by what is read of it so that this module needs nothing of that one."""

    @property
    def run_id(self) -> int: ...
    @property
    def model(self) -> torch.nn.Module: ...
    @property
    def learner(self) -> Learner: ...
    @property
    def gang(self) -> LearnerGang | None: ...


def snapshot_save(*, res: Snapshotted, step: int) -> Path:
    """The full trainer state after `step`, atomically and durably (the journal it lets go
    of is deleted right after)."""
    import torch

    out = state_dir(res.run_id, step)
    parent = out.parent
    parent.mkdir(parents=True, exist_ok=True)
    # The optimizer goes into the same atomic directory as the weights.
    staging = parent / f".stage-{step}-{os.getpid()}"
    if staging.exists():
        shutil.rmtree(staging)
    if res.gang is not None:
        # Each rank its shard of the weights and optimizer state (torch.distributed.checkpoint).
        res.gang.save(staging / "dcp")
    else:
        res.model.save_pretrained(staging, safe_serialization=True)
        torch.save(res.learner.optimizer_state(), staging / "optimizer.pt")
    (staging / "trainer_state.json").write_text(json.dumps({"step": step}))
    for path in staging.rglob("*"):
        if path.is_file():
            _fsync_path(path)
    if out.exists():
        shutil.rmtree(out)
    os.replace(staging, out)
    _fsync_path(parent)
    return out


def _step_of(path: Path) -> int | None:
    try:
        return int(path.name.removesuffix(".json").split("-")[1])
    except (IndexError, ValueError):
        return None


def _snapshots(run_id: int) -> dict[int, Path]:
    out = {}
    for path in trainer_dir(run_id).glob("step-*"):
        step = _step_of(path)
        if step is not None and ((path / "optimizer.pt").exists() or (path / "dcp" / ".metadata").exists()):
            out[step] = path
    return out


def state_prune(*, run_id: int, snapshot_step: int) -> None:
    """Drop what the snapshot of `snapshot_step` covers: older snapshots and the journal up
    to it. Only called once that step has committed, so a restart never needs them."""
    for step, path in _snapshots(run_id).items():
        if step < snapshot_step:
            shutil.rmtree(path, ignore_errors=True)
    for path in (trainer_dir(run_id) / "journal").glob("step-*.json"):
        entry_step = _step_of(path)
        if entry_step is not None and entry_step <= snapshot_step:
            path.unlink(missing_ok=True)


def restore_point(run_id: int, train_step: int) -> tuple[Path | None, list[Path]] | None:
    """The newest snapshot at or before `train_step` (None: the config's model at step 0)
    whose later steps are all in the journal, with those journal entries in order."""
    snapshots = _snapshots(run_id)
    for base in sorted([s for s in snapshots if s <= train_step] + [0], reverse=True):
        entries = [journal_path(run_id, s) for s in range(base + 1, train_step + 1)]
        if all(e.exists() for e in entries):
            return snapshots.get(base) if base > 0 else None, entries
    return None


def snapshot_and_prune(*, res: Snapshotted, step: int) -> None:
    """After the step committed; a failure here loses nothing (the journal still holds the
    step), so it is logged, not raised."""
    try:
        snapshot_save(res=res, step=step)
        state_prune(run_id=res.run_id, snapshot_step=step)
    except Exception:
        log.exception("run %s: could not write the trainer snapshot of step %s; the journal covers it", res.run_id, step)
