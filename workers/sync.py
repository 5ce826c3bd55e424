"""Weight sync: how a trained version reaches the explorers.

`CheckpointSync` (the default, any hardware): the trainer writes a Hugging Face
`save_pretrained` directory under `RFT_STORAGE_DIR/runs/<id>/v<n>` (shared storage across
hosts), records the `ModelVersion`, and `weights.synced` goes out; explorers load the
directory at their next batch boundary (vLLM `reload_weights`, transformers
`load_state_dict`).

`NcclSync` (GPU hosts): the same checkpoint (so a restart, or an explorer that joins late,
still finds every version on disk), plus a broadcast of the tensors from the trainer's GPU
to the explorers' GPUs over an NCCL group, so explorers need not read the files.

Both publish through `apps.runs.services.model_version_publish`; which one a trainer uses is
`settings.RFT_WEIGHT_SYNC`.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any, Protocol

from django.conf import settings

from rftweb.exceptions import Unavailable


class SyncUnavailable(Unavailable):
    """This weight-sync path cannot run on this host (e.g. NCCL without CUDA)."""


def run_storage(run_id: int) -> Path:
    return Path(settings.RFT_STORAGE_DIR) / "runs" / str(run_id)


def version_dir(run_id: int, number: int) -> Path:
    return run_storage(run_id) / f"v{number}"


def save_pretrained_atomic(*, model: Any, tokenizer: Any, out: Path) -> Path:
    """Write a save_pretrained directory so that readers see all of it or none of it:
    into a temporary sibling first, then one rename."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    model.save_pretrained(tmp, safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(tmp)
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    return out


class WeightSync(Protocol):
    name: str

    def publish(self, *, run: Any, number: int, train_step: int, model: Any, tokenizer: Any) -> float:
        """Make version `number` of `run` available to explorers; returns seconds taken."""
        ...


class CheckpointSync:
    name = "checkpoint"

    def publish(self, *, run: Any, number: int, train_step: int, model: Any, tokenizer: Any) -> float:
        from apps.runs.services import model_version_publish

        started = time.perf_counter()
        out = save_pretrained_atomic(model=model, tokenizer=tokenizer, out=version_dir(run.pk, number))
        model_version_publish(run=run, number=number, checkpoint=str(out), train_step=train_step)
        return time.perf_counter() - started


class NcclSync(CheckpointSync):
    """Checkpoint plus an NCCL broadcast from the trainer (rank 0) to explorer ranks.

    The group is joined once per process (`init_process_group` with the `nccl` backend, a
    TCP rendezvous at `RFT_NCCL_ADDR`, world size `RFT_NCCL_WORLD`); explorers run
    `NcclSync.receive` into their engine's parameters (vLLM: through its weight-transfer
    hook) when `weights.synced` arrives.
    """

    name = "nccl"

    def __init__(self, *, addr: str | None = None, world_size: int | None = None, rank: int = 0) -> None:
        import torch

        if not torch.cuda.is_available():
            raise SyncUnavailable("NCCL weight sync needs CUDA on this host; use RFT_WEIGHT_SYNC=checkpoint")
        self.addr = addr or settings.RFT_NCCL_ADDR
        self.world_size = world_size or settings.RFT_NCCL_WORLD
        self.rank = rank
        self._group: Any = None

    def _group_get(self) -> Any:
        import torch.distributed as dist

        if self._group is None:
            if not dist.is_initialized():
                dist.init_process_group("nccl", init_method=self.addr, world_size=self.world_size, rank=self.rank)
            self._group = dist.group.WORLD
        return self._group

    def broadcast(self, model: Any) -> int:
        """Send every parameter from rank 0; returns the bytes sent."""
        import torch.distributed as dist

        group = self._group_get()
        sent = 0
        for _, tensor in sorted(model.state_dict().items()):
            t = tensor.detach().cuda().contiguous()
            dist.broadcast(t, src=0, group=group)
            sent += t.numel() * t.element_size()
        return sent

    def receive(self, model: Any) -> None:
        """Explorer side: fill `model`'s tensors from rank 0's broadcast, in the same order."""
        import torch
        import torch.distributed as dist

        group = self._group_get()
        with torch.no_grad():
            for _, tensor in sorted(model.state_dict().items()):
                buf = tensor.detach().cuda().contiguous()
                dist.broadcast(buf, src=0, group=group)
                tensor.copy_(buf.to(tensor.device))

    def publish(self, *, run: Any, number: int, train_step: int, model: Any, tokenizer: Any) -> float:
        seconds = super().publish(run=run, number=number, train_step=train_step, model=model, tokenizer=tokenizer)
        if self.world_size > 1:
            started = time.perf_counter()
            self.broadcast(model)
            seconds += time.perf_counter() - started
        return seconds


def weight_sync_for(name: str | None = None) -> WeightSync:
    name = name or settings.RFT_WEIGHT_SYNC
    if name == "checkpoint":
        return CheckpointSync()
    if name == "nccl":
        return NcclSync()
    raise ValueError(f"unknown weight sync {name!r}; use checkpoint or nccl")
