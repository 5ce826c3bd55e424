"""A learner as a group of processes, on PyTorch's own sharding: FSDP2 (`fully_shard`) or,
sharded `none`, DistributedDataParallel (gloo on CPU, NCCL on GPUs).

Every rank builds the same learner, takes rank 0's trainable state (weights, optimizer),
then shards it (`learner_shard`): with `trainer.sharding: full` parameters, gradients and
optimizer state are split across the ranks and each decoder block's weights are gathered
for its forward and backward and freed after (ZeRO-3); `grad_op` keeps the gathered
weights from the forward to the backward (ZeRO-2: less traffic, more memory); `none`
replicates the model and averages gradients (DDP). bf16 on GPUs is FSDP2's
`MixedPrecisionPolicy` (bf16 compute, fp32 gradient reduction; the sharded master weights
stay fp32).

Each rank trains on its part of every batch (`Objective.shard_loss`: rows dealt
round-robin, each part weighted by its share of the whole batch's normaliser — sequences,
completion tokens or pairs, as TRL normalises each loss — with GRPO advantages taken on
the whole batch first), so the reduced gradient, and the update, is the one-process update
on the whole batch. Every algorithm and loss type runs so.

`LearnerGroup` is how a train worker runs a run's learner that way (`trainer.processes`
> 1): its own process is rank 0 and keeps everything the trainer does (claims, journal,
commits, checkpoints, versions); it starts the other ranks (`python -m
workers.algorithms.distributed`) and they join one process group through a TCP store on
rank 0's host (RFT_LEARNER_ADDR / RFT_LEARNER_PORT). Rank 0 sends them each step's batch
(the journal entry, with the RNG state it starts from). The plugin modules rank 0 loaded
(RFT_PLUGINS, kernel/plugins.py) are in the group's spec, and every other rank imports them
before it reads the run's config: an algorithm added from a file of its own trains sharded
too. Rank 0 too builds its learner on its
shards only where it starts from the run's model (workers/algorithms/shard_load.py). A
published version is a whole model: the ranks gather it one tensor at a time into rank 0's
skeleton of the policy (`whole`, on the meta device), which lets go of it at the next step. Snapshots are sharded (`torch.distributed.checkpoint`: each rank writes its
shard; they load on any number of ranks, or in one process).

The group is the process's default process group (DeviceMesh needs one), so a train
worker runs one learner group at a time and cannot also hold the NCCL weight sync's
group (RFT_WEIGHT_SYNC=nccl). A follower ends when rank 0 closes the group or its parent
process goes away; a rank that stops before joining tells rank 0 why through the store, and
the group's start fails at once with that reason (`ranks_await`).

Every collective and the rendezvous wait at most the run's `trainer.collective_timeout_s`
(gloo's and NCCL's own timeout, set when the group is made). A rank whose host is lost or
whose link is cut sends no reset: the others' collective waits that long and fails; a rank
whose process dies fails it at once (its connection resets). Either way rank 0 raises
GroupLost naming the ranks that stopped answering and their hosts (each follower keeps a
heartbeat counter in rank 0's store and says there at which address it reaches rank 0), and
nothing of the step is committed. Between steps a follower waits for rank 0's next operation
in the store (`_op_await`), not inside a collective, so a group idle for longer than the
timeout (rollouts between two steps) is not taken for a lost one.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import hashlib
import importlib.metadata
import json
import logging
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal, TypedDict

import torch

from kernel.exceptions import InvalidInput
from kernel.jsontypes import JSONObject
from kernel.plugins import PluginMissing, plugins_load, plugins_loaded
from workers.algorithms.batch import TrainBatch
from kernel.config import config_validate
from workers.adapters import adapter_wrap
from workers.algorithms import Learner, NothingToTrain, spec_from_config
from workers.algorithms.objectives import objective_class
from workers.engines.base import tokenizer_from_pretrained
from workers.group_lost import GroupLost
from workers.host_memory import cpu_allocator_tune, rank_mmap_threshold
from workers.vision import is_vision_model

if TYPE_CHECKING:
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import MixedPrecisionPolicy

    from transformers import PreTrainedTokenizerBase

    from kernel.config import AdapterConfig, RunConfig
    from workers.algorithms.learner import Learner, LearnerSpec
    from workers.algorithms.shard_load import LearnerBuild

log = logging.getLogger(__name__)

SHARDINGS = ("full", "grad_op", "none")
# How long rank 0 waits for a follower it told to stop (or terminated) before it kills it: a
# backstop, not a pace. A follower ends at once (`os._exit` below), but a host's load can hold
# any process off the CPU for seconds.
FOLLOWER_EXIT_S = 60.0
# A follower adds one to its heartbeat counter in rank 0's store every BEAT_S (a thread of its
# own, which runs while the rank computes or waits in a collective). After a failed
# collective rank 0 watches the counters for SILENT_S: the ranks whose counter did not move
# are the ones lost (a stopped or cut-off process, or a host gone).
BEAT_S = 0.5
SILENT_S = 3.0
# How often a follower between steps looks for rank 0's next operation in the store.
OP_POLL_S = 0.05


@dataclass
class Shard:
    """This process's place in a learner group: rank of world."""

    rank: int
    world: int
    sharding: str = "full"
    # The rank's weighted loss term of the last step (its share of the batch's loss).
    last_term: float = field(default=0.0, init=False)

    def loss(self, learner: Learner, batch: TrainBatch) -> tuple[torch.Tensor, dict[str, float]]:
        loss, metrics = learner.objective.shard_loss(batch, rank=self.rank, world=self.world)
        self.last_term = float(loss.detach())
        # FSDP2 and DDP average the gradients over the ranks; the terms are to be summed.
        return loss * self.world, metrics

    def reduce(self, loss: torch.Tensor) -> torch.Tensor:
        """The whole batch's loss (the metric): the ranks' terms summed."""
        import torch.distributed as dist

        total = (loss.detach() / self.world).reshape(1).float().to(_comm_device())
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
        return total[0]


def _comm_device() -> str:
    """Where this process's collectives' tensors live (NCCL takes GPU tensors only)."""
    import torch.distributed as dist

    if dist.get_backend() == "nccl":
        return f"cuda:{torch.cuda.current_device()}"
    return "cpu"


# ----------------------------------------------------------------------------- sharding a learner


def model_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's repeated blocks (transformers' `_no_split_modules`: the decoder layers),
    outermost only (a vision tower's layers inside a listed module stay in it)."""
    names: set[str] = set()
    for module in model.modules():
        names.update(getattr(module, "_no_split_modules", None) or ())
    blocks = [m for m in model.modules() if type(m).__name__ in names]
    inner = {id(c) for b in blocks for c in b.modules() if c is not b}
    return [b for b in blocks if id(b) not in inner]


def _units(model: torch.nn.Module) -> list[torch.nn.Module | list[torch.nn.Module]]:
    """The model's FSDP2 units below the root, each gathered for its own forward and backward
    only: the repeated blocks (transformers' `_no_split_modules`: the decoder layers), the
    input embeddings unless tied, and the output head grouped with the last block."""
    blocks = model_blocks(model)
    units: list[torch.nn.Module | list[torch.nn.Module]] = list(blocks)
    get_in, get_out = getattr(model, "get_input_embeddings", None), getattr(model, "get_output_embeddings", None)
    embed = get_in() if callable(get_in) else None
    head = get_out() if callable(get_out) else None
    tied = head is not None and embed is not None and getattr(head, "weight", None) is getattr(embed, "weight", None)
    if isinstance(embed, torch.nn.Module) and not tied:
        # Otherwise it would stay gathered in the root unit from the forward to the backward.
        units.insert(0, embed)
    if isinstance(head, torch.nn.Module) and not tied and blocks and not any(head in b.modules() for b in blocks):
        # TRL's fused head reads the head's weight without calling it, inside the root's
        # forward, so it cannot be a unit of its own; in the root it would be gathered, with
        # its whole gradient, from the forward's start to the backward's end (on the ~100M
        # bench model a quarter of a rank's peak, bench/sharding --phases). Grouped with
        # the last block it is gathered from that block's forward (the group is completed at
        # the root's post-forward: FSDP2's chunked-loss case) and its gradient reduced and
        # freed right after that block's backward.
        units[-1] = [blocks[-1], head]
    return units


def _mixed_precision(precision: str) -> MixedPrecisionPolicy:
    """FSDP2's policy for bf16 on GPUs: bf16 compute, fp32 gradient reduction; the sharded
    master weights (and the optimizer) stay fp32. Elsewhere None (autocast does the rest)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if precision == "bf16" and torch.cuda.is_available():
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()


def _fully_shard(model: torch.nn.Module, *, mesh: DeviceMesh, reshard: bool, precision: str) -> None:
    from torch.distributed.fsdp import fully_shard

    policy = _mixed_precision(precision)
    for unit in _units(model):
        fully_shard(unit, mesh=mesh, reshard_after_forward=reshard, mp_policy=policy)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard, mp_policy=policy)


_SAFETENSORS_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
                       "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
                       "BOOL": torch.bool}


class _SafetensorsRows:
    """Rows of the tensors in one safetensors file, read with plain reads of just their
    bytes (a tensor is stored row-major, so rows are one contiguous range). safetensors'
    own reader maps the whole file: its pages would count in this process's memory (RSS as
    they are touched, the whole file against RLIMIT_AS)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fh = open(path, "rb")  # noqa: SIM115 (closed by close())
        size = int.from_bytes(self.fh.read(8), "little")
        self.header: dict[str, dict[str, object]] = json.loads(self.fh.read(size))
        self.header.pop("__metadata__", None)
        self.base = 8 + size

    def keys(self) -> list[str]:
        return list(self.header)

    def rows(self, key: str, start: int | None = None, end: int | None = None) -> torch.Tensor:
        entry = self.header[key]
        dtype = _SAFETENSORS_DTYPES[str(entry["dtype"])]
        shape = [int(d) for d in entry["shape"]]  # type: ignore[attr-defined]
        begin, stop = (int(o) for o in entry["data_offsets"])  # type: ignore[attr-defined]
        if not shape:
            start, end = 0, 1
        rows = shape[0] if shape else 1
        start, end = start or 0, rows if end is None else end
        row_bytes = (stop - begin) // max(1, rows)
        buf = bytearray((end - start) * row_bytes)
        self.fh.seek(self.base + begin + start * row_bytes)
        if self.fh.readinto(buf) != len(buf):
            raise ValueError(f"{self.path}: {key} is cut short")
        out = torch.frombuffer(buf, dtype=dtype) if buf else torch.empty(0, dtype=dtype)
        return out.reshape([end - start, *shape[1:]] if shape else [])

    def close(self) -> None:
        self.fh.close()


def _safetensors_files(path: Path) -> dict[str, Path]:
    """Which of a saved model's safetensors files holds each weight (one file, or the
    index of a model saved in several)."""
    index = path / "model.safetensors.index.json"
    if index.exists():
        return {k: path / v for k, v in json.loads(index.read_text())["weight_map"].items()}
    single = _SafetensorsRows(path / "model.safetensors")
    single.close()
    return {k: single.path for k in single.keys()}


def _row_range(rows: int, rank: int, world: int) -> tuple[int, int]:
    """The rows of a weight FSDP2 gives `rank` (its dim-0 `Shard`: `torch.chunk`'s split)."""
    size = -(-rows // world)
    start = min(rank * size, rows)
    return start, min(start + size, rows)


def _aliases(model: torch.nn.Module) -> dict[str, list[str]]:
    """Each parameter's name (the first it is registered under) with its other names (tied
    weights: a head that is the input embeddings)."""
    first: dict[int, str] = {}
    names: dict[str, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        key = first.setdefault(id(p), name)
        names.setdefault(key, [])
        if key != name:
            names[key].append(name)
    return names


def _adapter_start(config: object, lora: AdapterConfig, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """A fresh adapter's weights (small: the whole of them) as `adapter_wrap` makes them on
    the loaded model, drawing the same random numbers: peft sizes an adapter by its layers'
    features, so it is made here on a skeleton whose weights are empty."""
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    with init_empty_weights(include_buffers=False):
        skeleton = AutoModelForCausalLM.from_config(config, dtype=dtype)
    for module in skeleton.modules():
        if isinstance(module, torch.nn.Linear):
            module.weight = torch.nn.Parameter(torch.empty(0, dtype=dtype), requires_grad=False)
    wrapped = adapter_wrap(model=skeleton, lora=lora)
    return {n: p.detach() for n, p in wrapped.named_parameters() if p.requires_grad}


def _base_key(name: str) -> str:
    """A weight's name in the base model's files (an adapter model's base weights are
    renamed by peft: base_model.model.… and ….base_layer.…)."""
    return name.removeprefix("base_model.model.").replace(".base_layer.", ".")


def model_sharded_load(path: str | Path, *, mesh: DeviceMesh, reshard: bool, precision: str,
                       dtype: torch.dtype = torch.float32, lora: AdapterConfig | None = None) -> torch.nn.Module:
    """The causal LM saved at `path` (transformers' directory of safetensors files), sharded
    as `learner_shard` shards one, without this process ever holding the whole of it: built
    on the meta device, sharded (FSDP2), then given storage for this rank's rows only, read
    from the files. Buffers the files lack (rotary `inv_freq`) are computed on the CPU as a
    whole build computes them; tied weights stay one parameter. `lora`: with a fresh adapter
    (`adapter_wrap`'s, the same weights) on the frozen base."""
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM

    path = Path(path)
    config = AutoConfig.from_pretrained(path)
    adapter = _adapter_start(config, lora, dtype) if lora is not None else {}
    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    # As loading does (from_config leaves a tied head its own weight); outside the context,
    # whose register_parameter would give the head a new meta weight again.
    model.tie_weights()
    if lora is not None:
        with init_empty_weights(include_buffers=False):
            model = adapter_wrap(model=model, lora=lora)
    aliases = _aliases(model)
    _fully_shard(model, mesh=mesh, reshard=reshard, precision=precision)
    buffers = {name: b.detach().clone() for name, b in model.named_buffers()}
    model.to_empty(device=mesh.device_type)
    files = _safetensors_files(path)
    rank, world = mesh.get_local_rank(), mesh.size()
    params = dict(model.named_parameters(remove_duplicate=False))
    with contextlib.ExitStack() as stack, torch.no_grad():
        opened = {f: _SafetensorsRows(f) for f in sorted(set(files.values()))}
        for reader in opened.values():
            stack.callback(reader.close)
        for name, b in model.named_buffers():
            # A persistent buffer as saved; the others (inv_freq) as the CPU build made them.
            key = _base_key(name)
            b.copy_(opened[files[key]].rows(key) if key in files else buffers[name])
        for name, others in aliases.items():
            param = params[name]
            local = param.to_local() if hasattr(param, "to_local") else param
            start, end = _row_range(param.shape[0], rank, world) if hasattr(param, "to_local") else (0, param.shape[0])
            if end - start != local.shape[0]:
                raise RuntimeError(f"{name}: rank {rank} holds {local.shape[0]} rows of {param.shape[0]}, "
                                   f"expected rows {start}-{end}")
            if name in adapter:
                local.copy_(adapter[name][start:end])
                continue
            found = next((k for k in map(_base_key, (name, *others)) if k in files), None)
            if found is None:
                raise ValueError(f"{path}: no weight {_base_key(name)} in its safetensors files")
            if end > start:
                local.copy_(opened[files[found]].rows(found, start, end))
    model.train()
    return model


def _is_sharded(model: torch.nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def learner_shard(learner: Learner, *, rank: int, world: int, sharding: str, from_rank0: bool = False) -> Shard:
    """Shard a learner that is the same on every rank of the (default) process group, in
    place: its optimizer is rebuilt over the shards and keeps the state it had.

    from_rank0 (sharding full or grad_op): the other ranks built theirs sharded already
    (`model_sharded_load`: the run's model, frozen weights included) and take rank 0's
    trainable weights, optimizer and scheduler state here, each rank its shards (rank 0's
    whole tensors are broadcast one at a time)."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_optimizer_state_dict,
        set_optimizer_state_dict,
    )

    if sharding not in SHARDINGS:
        raise ValueError(f"trainer.sharding: {sharding!r} is not one of {', '.join(SHARDINGS)}")
    model = learner.model
    if sharding == "none":
        from torch.nn.parallel import DistributedDataParallel

        device = next(model.parameters()).device
        learner.forward_model = DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None,
            # A borrowed row's loss weighted by zero still reaches every weight.
            find_unused_parameters=False,
        )
        return Shard(rank=rank, world=world, sharding=sharding)
    from torch.distributed.device_mesh import init_device_mesh

    full = StateDictOptions(full_state_dict=True, broadcast_from_rank0=from_rank0)
    # A fresh optimizer has no state; asking for its state dict would make one (a zero step).
    optim_state = get_optimizer_state_dict(model, learner.optimizer, options=full) if learner.optimizer.state else None
    scheduler_state = learner.scheduler.state_dict() if learner.scheduler is not None else None
    weights = {n: p.detach() for n, p in model.named_parameters() if p.requires_grad} if from_rank0 and rank == 0 else {}
    if from_rank0:
        import torch.distributed as dist

        # What rank 0 has, every rank: whether there is optimizer state, and the scheduler's.
        told: list[tuple[bool, dict[str, object] | None]] = [(optim_state is not None, scheduler_state)]
        dist.broadcast_object_list(told, src=0)
        has_optim, scheduler_state = told[0]
        if has_optim and optim_state is None:
            optim_state = {}
    device = next(model.parameters()).device.type
    mesh = init_device_mesh(device, (world,))
    if not _is_sharded(model):  # else built sharded already (model_sharded_load)
        _fully_shard(model, mesh=mesh, reshard=sharding == "full", precision=learner.spec.precision)
    if learner.ref_model is not None and not _is_sharded(learner.ref_model):
        # Frozen, forward only: gathered block by block like the policy.
        _fully_shard(learner.ref_model, mesh=mesh, reshard=True, precision=learner.spec.precision)
    learner.optimizer_rebuild()
    if from_rank0:
        from torch.distributed.checkpoint.state_dict import set_model_state_dict

        # Only the trainable weights (a frozen base is the run's model on every rank).
        set_model_state_dict(model, weights, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True,
                                                                      strict=False))
    if optim_state is not None:
        set_optimizer_state_dict(model, learner.optimizer, optim_state, options=full)
    if scheduler_state is not None and learner.scheduler is not None:
        learner.scheduler.load_state_dict(scheduler_state)
    return Shard(rank=rank, world=world, sharding=sharding)


def whole_state(learner: Learner) -> dict[str, torch.Tensor]:
    """The policy's whole state dict (every rank calls it; rank 0 gets the tensors, on
    the CPU, the others an empty dict)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return dict(get_model_state_dict(learner.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)))


def _dcp_state(learner: Learner) -> dict[str, object]:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    fresh = not learner.optimizer.state
    model_state, optim_state = get_state_dict(learner.model, learner.optimizer)
    if fresh:  # get_state_dict gave it a zero step (Adam's step 2 next): as one process, none
        learner.optimizer.state.clear()
    state: dict[str, object] = {"model": model_state, "optim": optim_state}
    if learner.scheduler is not None:
        state["scheduler"] = learner.scheduler.state_dict()
    return state


def sharded_save(learner: Learner, path: Path) -> None:
    """Write the learner's weights and optimizer state through torch.distributed.checkpoint:
    in a group every rank its shard (all ranks call it), in one process the whole."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    state = _dcp_state(learner)
    scheduler = state.pop("scheduler", None)
    dcp.save(state, checkpoint_id=str(path), no_dist=not dist.is_initialized())
    if scheduler is not None and (not dist.is_initialized() or dist.get_rank() == 0):
        torch.save(scheduler, path / "scheduler.pt")


def sharded_load(learner: Learner, path: Path) -> None:
    """Load what `sharded_save` wrote, on however many ranks (all call it) or in one process."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    state = _dcp_state(learner)
    state.pop("scheduler", None)
    dcp.load(state, checkpoint_id=str(path), no_dist=not dist.is_initialized())
    set_state_dict(learner.model, learner.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    if learner.scheduler is not None and (path / "scheduler.pt").exists():
        learner.scheduler.load_state_dict(torch.load(path / "scheduler.pt", weights_only=False))


# ----------------------------------------------------------------------------- a group of processes


class GroupUnsupported(InvalidInput, ValueError):
    """This host cannot run the learner group asked for (say, fewer GPUs than processes)."""

    code = "group_unsupported"


def group_backend(local: int) -> tuple[str, str]:
    """(backend, rank 0's device) for `local` learner processes on this host: NCCL (gloo
    beside it for the CPU messages) with a GPU per process, gloo where there is no GPU; a
    host with GPUs, but fewer than processes, is refused (NCCL will not put two ranks on
    one GPU)."""
    if not torch.cuda.is_available():
        return "gloo", "cpu"
    if torch.cuda.device_count() < local:
        raise GroupUnsupported(f"trainer.processes: {local} learner processes need {local} GPUs on the train "
                               f"worker's host; it has {torch.cuda.device_count()}")
    return "cpu:gloo,cuda:nccl", "cuda:0"


@functools.cache
def code_fingerprint() -> dict[str, str]:
    """What every rank must share with rank 0: this checkout's Python sources (apps, workers,
    rftweb) and the libraries that shape the model and the messages. Read once a process (at
    its first group), so files changed under a running worker after that do not move it."""
    root = Path(__file__).resolve().parents[2]
    digest = hashlib.sha256()
    for path in sorted(p for part in ("apps", "workers", "rftweb") for p in (root / part).rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    out = {"sources": digest.hexdigest()[:16]}
    for lib in ("torch", "transformers", "trl"):
        out[lib] = importlib.metadata.version(lib)
    return out


def code_check(spec: dict[str, object], *, where: str) -> None:
    """GroupUnsupported naming what differs when this process runs other code than rank 0
    (whose fingerprint the group's spec carries): on other code a rank would fail inside a
    collective, with an error about tensor sizes rather than the cause."""
    theirs = spec.get("code")
    mine = code_fingerprint()
    if not isinstance(theirs, dict):
        theirs = {}
    differ = [f"{k} {mine[k]} here, {theirs.get(k, 'unknown')} at rank 0" for k in mine if theirs.get(k) != mine[k]]
    if differ:
        raise GroupUnsupported(f"{where} runs other code than rank 0 ({'; '.join(differ)}): install the same "
                               "commit and libraries on every host of a learner group")


# A group's start in rank 0's store: each other rank adds one to READY just before it joins
# the process group; a rank, or another host's `join`, that cannot join sets REFUSED to why.
# Rank 0 waits on these before it joins itself (`ranks_await`): a refusal, or a follower that
# ended, fails the group start at once with its reason, where waiting inside the process
# group's rendezvous would last its whole timeout (the train task's time limit) and then say
# only that it timed out.
READY, REFUSED = "rft/ready", "rft/refused"
# Each follower's address as it reaches rank 0 (HOST + rank), its heartbeat counter (BEAT +
# rank), and rank 0's operations in turn (OP + number: "go", or "abort" for a broken group).
# Another host's `join` keeps a heartbeat of its own (JOINING + host) from when it has read the
# group's plan: its ranks are starting (torch imported, the model loaded), not lost.
HOST, BEAT, OP, JOINING = "rft/host/", "rft/beat/", "rft/op/", "rft/joining/"


def _address_towards(addr: str, port: int) -> str:
    """This host's address on the way to addr (what rank 0 names a lost rank's host by)."""
    import socket

    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((addr, port))  # a datagram socket sends nothing: only the route is looked up
            return str(s.getsockname()[0])
    except OSError:
        return socket.gethostname()


def beat_start(*, addr: str, port: int, generation: int, rank: int | None = None, host: int | None = None) -> None:
    """Keep a heartbeat in rank 0's store until the store goes, over a connection of its own
    (a store client is not shared between threads): a rank's (saying first at which address
    it reaches rank 0), or another host's `join`'s."""
    store, _ = dist_store(addr, port, generation)
    if rank is not None:
        store.set(f"{HOST}{rank}", _address_towards(addr, port))
    key = f"{BEAT}{rank}" if rank is not None else f"{JOINING}{host}"

    def beat() -> None:
        while True:
            try:
                store.add(key, 1)
            except Exception:
                return  # rank 0's store is gone: so is the group
            time.sleep(BEAT_S)

    threading.Thread(target=beat, name="learner-group-beat", daemon=True).start()


def ranks_silent(store: dist.Store, *, world: int, watch_s: float = SILENT_S) -> list[int]:
    """The other ranks whose heartbeat did not move in `watch_s` (rank 0 calls it after a
    collective failed)."""
    keys = [f"{BEAT}{r}" for r in range(1, world)]
    before = [store.add(k, 0) for k in keys]
    time.sleep(watch_s)
    return [r for r, k, b in zip(range(1, world), keys, before, strict=True) if store.add(k, 0) == b]


def rank_where(store: dist.Store, rank: int) -> str:
    """'rank R (host H, ADDRESS)': a rank as the run page names it."""
    plan = json.loads(store.get("rft/spec"))
    host = rank // max(1, int(plan["world"]) // int(plan["hosts"]))
    at = store.get(f"{HOST}{rank}").decode() if store.check([f"{HOST}{rank}"]) else "address not known"
    return f"rank {rank} (host {host}, {at})"


def is_comm_error(exc: BaseException) -> bool:
    """Whether `exc` came out of a collective's transport (a peer gone, reset or timed out),
    not out of the step's own code."""
    import torch.distributed as dist

    text = str(exc)
    return isinstance(exc, (dist.DistError, TimeoutError)) or (
        isinstance(exc, RuntimeError) and any(s in text for s in ("/gloo/", "NCCL", "Connection reset", "Timed out")))


def _op_await(store: dist.Store, number: int) -> bool:
    """Wait (as long as it takes) for rank 0's operation `number`; False: rank 0 gave the group up."""
    key = f"{OP}{number}"
    while not store.check([key]):
        time.sleep(OP_POLL_S)
    return bool(store.get(key) != b"abort")


def refusal_set(store: dist.Store, exc: BaseException, *, where: str) -> None:
    """Tell rank 0 why `where` will not join: GroupUnsupported stays one there (the run's
    error names what to change), anything else comes back as a RuntimeError."""
    why = str(exc) if isinstance(exc, GroupUnsupported) else f"{where} could not start: {type(exc).__name__}: {exc}"
    try:
        store.set(REFUSED, json.dumps({"unsupported": isinstance(exc, GroupUnsupported), "why": why}))
    except Exception:  # rank 0 gone too: nobody to tell
        log.warning("learner group: could not tell rank 0 why %s stopped", where, exc_info=True)


def ranks_await(store: dist.Store, *, world: int, timeout: datetime.timedelta,
                followers: list[subprocess.Popen[bytes]], poll_s: float = 0.2) -> None:
    """Return once the other `world - 1` ranks are joining; raise with a rank's refusal
    (`refusal_set`), when a follower started here ended first, or, GroupLost, when a rank has
    given no sign of life for `timeout`: ranks started here are waited for while they live,
    another host's while its `join` or the rank itself beats (`beat_start`; their start,
    torch imported and the model loaded, is not a host lost)."""
    local = len(followers) + 1  # ranks 0 … local − 1 are this host's
    deadline = time.monotonic() + timeout.total_seconds()
    beats: dict[str, tuple[int, float]] = {}  # key: (counter, when it last moved)
    while True:
        ended = [(p.pid, p.returncode) for p in followers if p.poll() is not None]
        if store.check([REFUSED]):  # read after `ended`: a follower sets it before it exits
            refusal = json.loads(store.get(REFUSED))
            raise (GroupUnsupported if refusal["unsupported"] else RuntimeError)(f"learner group: {refusal['why']}")
        if ended:
            raise RuntimeError(f"learner group: follower process(es) ended before joining (pid, exit status): {ended}")
        ready = store.add(READY, 0)
        if ready >= world - 1:
            return
        absent = [r for r in range(1, world) if not store.check([f"{READY}/{r}"])]
        if any(r < local for r in absent) or _beating(store, [k for r in absent for k in (f"{BEAT}{r}", f"{JOINING}{r // local}")],
                                                       beats):
            deadline = time.monotonic() + timeout.total_seconds()
        elif time.monotonic() > deadline:
            who = ", ".join(f"rank {r} (host {r // local})" for r in absent)
            raise GroupLost(f"learner group: {who} did not come within {timeout.total_seconds():g} s "
                            "(trainer.collective_timeout_s); is `python -m workers.algorithms.distributed join ADDR "
                            "PORT HOST` running on every other host, and can it reach this one?")
        time.sleep(poll_s)


def _beating(store: dist.Store, keys: list[str], seen: dict[str, tuple[int, float]]) -> bool:
    """Whether any of these heartbeat counters moved within the last SILENT_S (`seen` keeps
    each one's last value and when it changed)."""
    now = time.monotonic()
    for key in keys:
        value = store.add(key, 0)
        if key not in seen or seen[key][0] != value:
            seen[key] = (value, now if value else 0.0)
    return any(now - seen[k][1] < SILENT_S for k in keys if seen[k][0])


def group_join(*, store: dist.Store, rank: int, world: int, backend: str, timeout: datetime.timedelta) -> None:
    """Make the learner group this process's default process group (FSDP2's DeviceMesh
    takes the default one)."""
    import torch.distributed as dist

    if dist.is_initialized():
        raise GroupUnsupported("a learner group needs this process's default process group, and it is taken (the NCCL "
                               "weight sync, or another run's learner group): use RFT_WEIGHT_SYNC=checkpoint, or one "
                               "learner group per train worker")
    dist.init_process_group(backend, store=dist.PrefixStore("learner", store), rank=rank, world_size=world,
                            timeout=timeout)


class GroupMessage(TypedDict, total=False):
    """What rank 0 tells the other ranks over the channel: an operation (with the path a
    `save` writes to), or the names of the trainable weights when the group starts."""

    op: Literal["step", "whole", "save", "stop"]
    path: str
    names: list[str]


class _Channel:
    """Bytes and tensors from rank 0 to the other ranks (over the default group, on the CPU)."""

    def bytes(self, data: bytes | None) -> bytes:
        import torch.distributed as dist

        size = torch.tensor([len(data) if data is not None else 0], dtype=torch.int64)
        dist.broadcast(size, src=0)
        if data is not None:
            buf = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
        else:
            buf = torch.empty(int(size.item()), dtype=torch.uint8)
        dist.broadcast(buf, src=0)
        return data if data is not None else bytes(buf.numpy().tobytes())

    def message(self, msg: GroupMessage | None = None) -> GroupMessage:
        out: GroupMessage = json.loads(self.bytes(json.dumps(msg).encode() if msg is not None else None))
        return out

    def tensors(self, tensors: list[torch.Tensor]) -> None:
        """Rank 0 sends, the others receive into, tensors of the same shapes (in place)."""
        import torch.distributed as dist

        for t in tensors:
            buf = t.detach().cpu().contiguous()
            dist.broadcast(buf, src=0)
            if buf is not t:
                with torch.no_grad():
                    t.copy_(buf)


def state_share(channel: _Channel, learner: Learner, *, rank: int) -> None:
    """Make every rank's trainable weights and optimizer state rank 0's, before sharding (a
    frozen base is the run's model on every rank already)."""
    import io

    names = [n for n, p in learner.model.named_parameters() if p.requires_grad]
    got = channel.message({"names": names} if rank == 0 else None)["names"]
    if got != names:
        raise RuntimeError(f"learner group: rank {rank} holds other trainable weights than rank 0 "
                           f"({len(names)} against {len(got)})")
    channel.tensors([p for p in learner.model.parameters() if p.requires_grad])
    if rank == 0:
        buf = io.BytesIO()
        torch.save(learner.optimizer_state(), buf)
        channel.bytes(buf.getvalue())
    else:
        device = next(learner.model.parameters()).device
        state = torch.load(io.BytesIO(channel.bytes(None)), map_location=device, weights_only=False)
        learner.optimizer_state_load(state)


@dataclass
class GroupPlan:
    """What a learner group is: ranks in all, over how many hosts, sharded how."""

    world: int
    hosts: int = 1
    sharding: str = "full"

    @property
    def local(self) -> int:
        """Ranks per host (rank 0's host runs ranks 0 … local − 1)."""
        return self.world // self.hosts


class LearnerGroup:
    """Rank 0's side of a learner group: the follower processes it started on its host, the
    channel to every rank, and an unsharded copy of the policy (`whole`) that versions are
    written from. `step` is one update of the whole group on a batch."""

    def __init__(self, *, learner: Learner | None, run_config: JSONObject, plan: GroupPlan, timeout_s: float,
                 whole: torch.nn.Module | None = None, addr: str = "127.0.0.1", port: int = 0, checkpoint: Path | None = None,
                 build: LearnerBuild | None = None) -> None:
        """`learner`: rank 0's, whole, sharded here; None: built here on its shards only once
        the group is joined, from `build` (workers.algorithms.shard_load)."""
        import torch.distributed as dist

        spec = learner.spec if learner is not None else build.spec if build is not None else None
        assert spec is not None, "a learner group needs rank 0's learner or what to build it from"
        if not objective_class(spec.algorithm).shards():
            raise GroupUnsupported(f"trainer.processes: {spec.algorithm} has no sharded objective; set processes: 1")
        self.plan = plan
        self.world = plan.world
        self.backend, _ = group_backend(plan.local)
        self.whole = whole
        # The followers load only their shards of the model and take rank 0's trainable state
        # into them (`learner_shard` from_rank0), or, rank 0 built on its shards too, agree
        # with it already; sharded `none`, each holds a whole replica.
        self.followers_shard_load = sharded_load_fits(plan.sharding, model=str(run_config.get("model", "")))
        self.rank0_sharded = learner is None
        self.timeout_s = timeout_s
        timeout = datetime.timedelta(seconds=timeout_s)
        # Port 0: the system picks a free one (no race with another group starting); ranks
        # on other hosts need a fixed one (RFT_LEARNER_PORT).
        store, self.generation, self.port = _store_open("0.0.0.0" if plan.hosts > 1 else addr, port, world=plan.world,
                                                        timeout=timeout)
        self._store: dist.Store | None = store
        # Rank 0's operations so far (each announced in the store as OP + its number).
        self.ops = 0
        # What every rank builds its learner from: read from the store, so a rank on another
        # host needs only the address (`python -m workers.algorithms.distributed join`).
        store.set("rft/spec", json.dumps({
            "world": plan.world, "hosts": plan.hosts, "sharding": plan.sharding, "timeout_s": timeout_s,
            "config": run_config, "checkpoint": str(checkpoint) if checkpoint else None, "code": code_fingerprint(),
            "sharded_load": self.followers_shard_load, "rank0_sharded": self.rank0_sharded,
            "source": build.source if build is not None else None,  # issue 66.5: a version's weights
            "plugins": plugins_loaded(),
        }))
        # Set when a step failed part-way: the followers may be inside a collective, so they
        # are ended rather than sent a message they would mismatch.
        self.broken = False
        self.followers: list[subprocess.Popen[bytes]] = [
            _follower_start(addr="127.0.0.1", port=self.port, rank=rank, parent=os.getpid(), generation=self.generation)
            for rank in range(1, plan.local)
        ]
        # The processes started, kept after `close` forgets `followers` (to see them end).
        self.followers_started = list(self.followers)
        self.channel: _Channel | None = None
        try:
            ranks_await(store, world=plan.world, timeout=timeout, followers=self.followers)
            group_join(store=store, rank=0, world=plan.world, backend=self.backend, timeout=timeout)
            self.channel = _Channel()
            if learner is None:
                from workers.algorithms.shard_load import learner_sharded_build  # cycle: workers.algorithms.shard_load imports this module

                assert build is not None
                learner = learner_sharded_build(build, world=plan.world, sharding=plan.sharding)
            self.learner: Learner = learner
            if not self.followers_shard_load:
                state_share(self.channel, learner, rank=0)
            self.shard = learner_shard(learner, rank=0, world=plan.world, sharding=plan.sharding,
                                       from_rank0=self.followers_shard_load and not self.rank0_sharded)
            if checkpoint is not None:
                sharded_load(learner, checkpoint)
        except BaseException as exc:
            # A rank lost while the group forms is a GroupLost too; a rank's refusal is not.
            lost = self._failed(exc, "the group's start") if is_comm_error(exc) else None
            self.broken = True
            self.close()
            if lost is not None:
                raise lost from exc
            raise
        log.info("learner group of %s processes over %s host(s) (%s, sharding %s) started: followers %s", plan.world,
                 plan.hosts, self.backend, plan.sharding, [p.pid for p in self.followers])

    def _alive(self) -> None:
        dead = [p.pid for p in self.followers if p.poll() is not None]
        if dead:
            self.broken = True
            raise RuntimeError(f"learner group: follower process(es) {dead} ended; the group is restarted")

    def _op(self, msg: GroupMessage) -> None:
        self._alive()
        assert self.channel is not None and self._store is not None
        self.ops += 1
        self._store.set(f"{OP}{self.ops}", "go")  # the followers wait for it outside any collective
        self.channel.message(msg)

    def _failed(self, exc: BaseException, doing: str) -> GroupLost | None:
        """The group is broken; where a rank was lost (a collective's transport failed or
        timed out, or a follower ended), the GroupLost to raise, naming the ranks whose
        heartbeat stopped and their hosts; None where the step's own code failed."""
        self.broken = True
        dead = [p.pid for p in self.followers if p.poll() is not None]
        if self._store is None or not (dead or is_comm_error(exc)):
            return None
        store = self._store
        silent = ranks_silent(store, world=self.world)
        who = (", ".join(rank_where(store, r) for r in silent) + " stopped answering" if silent
               else "no rank stopped answering, but a collective failed")
        cause = str(exc).split("] ", 1)[-1].split(". ", 1)[0]  # gloo's: "[file:line] What. Advice…"
        log.warning("learner group: %s during %s", who, doing, exc_info=True)
        return GroupLost(f"learner group: {who} during {doing} (collectives wait at most "
                         f"trainer.collective_timeout_s = {self.timeout_s:g} s): {cause}")

    def step(self, batch: TrainBatch, *, entry: bytes) -> dict[str, float]:
        """One update on `batch` by every rank. `entry`: the batch as the journal encodes it
        (workers.trainer.journal_encode), RNG state included, which is what followers decode."""

        try:
            self.whole_release()
            self._op({"op": "step"})
            assert self.channel is not None
            self.channel.bytes(entry)
            metrics: dict[str, float] = self.learner.step(batch, shard=self.shard)
        except NothingToTrain:
            raise  # decided on the whole batch: every rank skipped together, the group is in step
        except BaseException as exc:
            lost = self._failed(exc, "a step")
            if lost is not None:
                raise lost from exc
            raise
        metrics["learner_processes"] = float(self.world)
        return metrics

    def whole_model(self) -> torch.nn.Module:
        """The unsharded policy as of the last step (gathered from every rank's shard)."""
        from workers.algorithms.shard_load import whole_assign, whole_gather  # cycle: workers.algorithms.shard_load imports this module

        if self.plan.sharding == "none":
            return self.learner.model  # a whole replica already
        try:
            self._op({"op": "whole"})
            state = whole_gather(self.learner)
        except BaseException as exc:
            lost = self._failed(exc, "gathering the policy for a version")
            if lost is not None:
                raise lost from exc
            raise
        assert self.whole is not None, "a sharded learner group needs its policy's skeleton (whole)"
        return whole_assign(self.whole, state)

    @property
    def streams_versions(self) -> bool:
        """Whether a version can be written from the shards without the whole model in
        rank 0's memory (`version_write`): full weights, sharded."""
        return self.whole is not None and self.plan.sharding != "none" and not self.learner.adapter

    def version_write(self, out: Path) -> int:
        """A full-weight version's model files in the directory `out`: the weights gathered
        one tensor at a time and written at once (rank 0 holds one whole tensor at most,
        where `whole_model` holds them all until the next step), the config and generation
        settings from the policy's skeleton. Returns the weight bytes written."""
        from transformers import PreTrainedModel

        from workers.algorithms.shard_load import whole_write  # cycle: workers.algorithms.shard_load imports this module

        skeleton = self.whole
        assert isinstance(skeleton, PreTrainedModel) and self.streams_versions, "versions stream from full weights, sharded"
        try:
            self._op({"op": "whole"})
            size = whole_write(self.learner, out / "model.safetensors")
        except BaseException as exc:
            lost = self._failed(exc, "writing a version")
            if lost is not None:
                raise lost from exc
            raise
        # As save_pretrained writes them: the weights' dtype and the class in the config.
        skeleton.config.dtype = str(skeleton.dtype).split(".")[1]
        skeleton.config.architectures = [type(skeleton).__name__]
        skeleton.config.save_pretrained(out)
        if skeleton.can_generate() and skeleton.generation_config is not None:
            skeleton.generation_config.save_pretrained(out)
        return size

    def whole_release(self) -> None:
        """Let go of the whole weights `whole_model` gathered (the policy's skeleton stays)."""
        from workers.algorithms.shard_load import whole_release  # cycle: workers.algorithms.shard_load imports this module

        if self.whole is not None and self.plan.sharding != "none":
            whole_release(self.whole)

    def save(self, path: Path) -> None:
        """A sharded checkpoint at `path` (each rank writes its shard)."""
        try:
            self.whole_release()
            self._op({"op": "save", "path": str(path)})
            sharded_save(self.learner, path)
        except BaseException as exc:
            lost = self._failed(exc, "a snapshot")
            if lost is not None:
                raise lost from exc
            raise

    def close(self) -> None:
        """Tell the followers to end (they also end on their own if this process dies), and
        leave the process group."""
        import torch.distributed as dist

        if self.channel is not None and not self.broken and all(p.poll() is None for p in self.followers):
            try:
                self._op({"op": "stop"})
            except Exception:
                self.broken = True
                log.warning("learner group: could not tell the followers to stop; ending them", exc_info=True)
        if self.broken and self._store is not None:
            try:  # a rank waiting for the next operation (not in a collective) ends on this
                self._store.set(f"{OP}{self.ops + 1}", "abort")
            except Exception:
                log.warning("learner group: could not tell the other ranks it is given up", exc_info=True)
        for p in self.followers:
            if self.broken:
                # It has nothing to finish, and may be stopped or stuck in a collective: a
                # stopped process would not act on SIGTERM before FOLLOWER_EXIT_S.
                p.kill()
            try:
                p.wait(timeout=FOLLOWER_EXIT_S)
            except subprocess.TimeoutExpired:
                log.warning("learner group: follower %s had not ended %.0f s after it was told to; killing it", p.pid,
                            FOLLOWER_EXIT_S)
                p.kill()
                p.wait()
        self.followers = []
        self.channel = None
        if dist.is_initialized():
            dist.destroy_process_group()
        self._store = None  # (a fixed port's store server stays: the next group is a generation in it)


# Rank 0's store on a fixed port (RFT_LEARNER_PORT, which other hosts' ranks are told), by
# address and port: the train worker's for as long as it lives. Each group is a generation in
# it (GENERATION counts them; a group's keys are under "rft/g<N>/"): the group re-formed after a
# lost rank cannot bind the port again at once, since its store listens until its last reference
# goes, and a broken group's references sit in reference cycles (the model's sharding state).
_STORES: dict[tuple[str, int], dist.TCPStore] = {}
_STORES_LOCK = threading.Lock()
GENERATION = "rft/generation"


def _store_open(addr: str, port: int, *, world: int, timeout: datetime.timedelta) -> tuple[dist.Store, int, int]:
    """A new group's store in rank 0's store server (a fresh server on port 0: the system picks
    a free port, no race with another group starting), its generation number and the port."""
    import torch.distributed as dist

    with _STORES_LOCK:
        base = _STORES.get((addr, port)) if port else None
        if base is None:
            base = dist.TCPStore(addr, port, world, is_master=True, timeout=timeout, wait_for_workers=False)
            if port:
                _STORES[(addr, port)] = base
    generation = int(base.add(GENERATION, 1))
    return dist.PrefixStore(f"rft/g{generation}", base), generation, int(base.port)


def _follower_start(*, addr: str, port: int, rank: int, parent: int, generation: int) -> subprocess.Popen[bytes]:
    # From the project's root (`-m` puts it on the path), whatever the worker's directory.
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return subprocess.Popen([sys.executable, "-m", "workers.algorithms.distributed", "rank", addr, str(port), str(rank),
                             str(parent), str(generation)], cwd=root, close_fds=True)


def _orphan_watch(parent: int) -> None:
    """End this follower when rank 0's process is gone (killed worker, crashed task)."""
    def watch() -> None:
        while True:
            if os.getppid() != parent:
                os._exit(3)
            time.sleep(1.0)

    threading.Thread(target=watch, name="learner-group-parent", daemon=True).start()


def follower_main(*, addr: str, port: int, rank: int, generation: int, parent: int = 0) -> None:
    """A follower: build the run's learner as rank 0 did, take rank 0's state, shard it,
    then train on every batch it sends until told to stop. What stops it before it joins
    goes to rank 0 as its refusal (`refusal_set`)."""
    if parent:
        _orphan_watch(parent)
    store, _ = dist_store(addr, port, generation)
    # From the start: while it loads, rank 0 sees it starting rather than absent.
    beat_start(addr=addr, port=port, generation=generation, rank=rank)
    try:
        start = _follower_ready(store, rank=rank)
    except BaseException as exc:
        refusal_set(store, exc, where=f"rank {rank}")
        raise
    import torch.distributed as dist

    from workers.algorithms.shard_load import whole_gather  # cycle: workers.algorithms.shard_load imports this module
    from workers.trainer import rng_restore, journal_decode

    plan = start.plan
    store.set(f"{READY}/{rank}", "1")
    store.add(READY, 1)
    group_join(store=store, rank=rank, world=plan.world, backend=start.backend, timeout=start.timeout)
    try:
        channel = _Channel()
        if start.learner is None:  # sharded_load: its shards only, rank 0's trainable state into them
            learner = follower_learner_sharded(start, rank=rank)
        else:
            learner = start.learner
            state_share(channel, learner, rank=rank)
        shard = learner_shard(learner, rank=rank, world=plan.world, sharding=plan.sharding,
                              from_rank0=start.learner is None and not start.rank0_sharded)
        if start.checkpoint:
            sharded_load(learner, Path(start.checkpoint))
        number = 0
        while True:
            number += 1
            if not _op_await(store, number):
                log.warning("learner group: rank 0 gave the group up (a rank was lost); rank %s ends", rank)
                return
            msg = channel.message()
            op = msg.get("op")
            if op == "stop":
                return
            if op == "whole":
                whole_gather(learner)
            elif op == "save":
                sharded_save(learner, Path(msg["path"]))
            elif op == "step":
                batch, rng = journal_decode(channel.bytes(None))
                rng_restore(rng)
                try:
                    learner.step(batch, shard=shard)
                except NothingToTrain:
                    pass  # decided on the whole batch: every rank skipped this update together
    finally:
        dist.destroy_process_group()


@dataclass(frozen=True)
class _FollowerReady:
    """What a follower needs to join: the run's learner (None where it loads only its
    shards, once joined: `follower_learner_sharded`), the group's plan, its backend and
    timeout, the sharded snapshot to start from (if any), and whether rank 0 loaded only its
    shards too (then no rank takes rank 0's trainable state: they agree already)."""
    learner: Learner | None
    plan: GroupPlan
    backend: str
    timeout: datetime.timedelta
    checkpoint: str | None
    cfg: RunConfig
    spec: LearnerSpec
    tokenizer: PreTrainedTokenizerBase
    rank0_sharded: bool = False
    source: str | None = None  # the policy's weights where not the run's model (LearnerBuild.source)


def sharded_load_fits(sharding: str, *, model: str) -> bool:
    """Whether a learner group's followers load only their shards of the run's model
    (`model_sharded_load`): sharded full or grad_op, a causal LM (a vision-language model is
    loaded whole, then sharded)."""
    path = Path(model)
    if sharding == "none" or not ((path / "model.safetensors").exists() or (path / "model.safetensors.index.json").exists()):
        return False  # a model name the hub resolves is loaded whole (from_pretrained finds its files)

    return not is_vision_model(model)


def follower_learner_sharded(start: _FollowerReady, *, rank: int) -> Learner:
    """A follower's learner on its shards only of the run's model (and of the reference
    model, or the frozen base under an adapter), built once the group is joined (the shards
    are the mesh's)."""
    from workers.algorithms.shard_load import LearnerBuild, learner_sharded_build  # cycle: workers.algorithms.shard_load imports this module

    return learner_sharded_build(LearnerBuild(cfg=start.cfg, spec=start.spec, tokenizer=start.tokenizer, source=start.source),
                                 world=start.plan.world, sharding=start.plan.sharding)


def _follower_ready(store: dist.Store, *, rank: int) -> _FollowerReady:
    """The run's learner built from the group's spec in rank 0's store as rank 0 built its
    own, with the rest of what joining takes (`_FollowerReady`)."""
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "rftweb.settings")
    django.setup()

    spec_in = json.loads(store.get("rft/spec"))
    code_check(spec_in, where=f"rank {rank}")  # its files may have changed since rank 0 started
    try:
        # Rank 0's plugin modules (its RFT_PLUGINS), whatever this rank's environment names:
        # the run's algorithm may be one of theirs.
        plugins_load(spec_in.get("plugins") or [], where=f"rank {rank}, as rank 0's RFT_PLUGINS")
    except PluginMissing as exc:
        raise GroupUnsupported(f"{exc}; install it on every host of a learner group") from exc
    plan = GroupPlan(world=int(spec_in["world"]), hosts=int(spec_in["hosts"]), sharding=str(spec_in["sharding"]))
    backend, _ = group_backend(plan.local)
    if torch.cuda.is_available():
        torch.cuda.set_device(rank % plan.local)
    cfg = config_validate(data=spec_in["config"])
    torch.manual_seed(cfg.seed)
    from workers.trainer import policy_load

    spec = spec_from_config(cfg)
    tokenizer = tokenizer_from_pretrained(cfg.tokenizer or cfg.model)
    from django.conf import settings

    if backend == "gloo" and settings.RFT_TRAINER_CPU_MMAP_THRESHOLD > 0:
        # As rank 0's worker does (workers/trainer/resident.py), before the learner is built:
        # scaled to this rank's share of the batch and of each gradient (workers/host_memory.py).
        cpu_allocator_tune(threshold=rank_mmap_threshold(settings.RFT_TRAINER_CPU_MMAP_THRESHOLD, world=plan.world))
    checkpoint = spec_in.get("checkpoint")
    learner = None
    if not spec_in.get("sharded_load"):
        model, ref_model = policy_load(cfg=cfg, spec=spec, source=cfg.model)
        learner = Learner(spec=spec, model=model, tokenizer=tokenizer, ref_model=ref_model)
    return _FollowerReady(learner=learner, plan=plan, backend=backend,
                          timeout=datetime.timedelta(seconds=float(spec_in["timeout_s"])),
                          checkpoint=str(checkpoint) if checkpoint else None, cfg=cfg, spec=spec, tokenizer=tokenizer,
                          rank0_sharded=bool(spec_in.get("rank0_sharded")), source=spec_in.get("source"))


def host_join(*, addr: str, port: int, host: int) -> int:
    """Another host's part of a learner group (trainer.hosts > 1): read the group's plan from
    rank 0's store at addr:port, run this host's ranks (host × local … + local − 1), one
    process each, until they end; returns the first failing one's exit status (0: all ended
    cleanly)."""
    store, generation = dist_store(addr, port)
    plan_in = json.loads(store.get("rft/spec"))
    try:
        code_check(plan_in, where=f"host {host}")
    except GroupUnsupported as exc:
        refusal_set(store, exc, where=f"host {host}")
        raise
    plan = GroupPlan(world=int(plan_in["world"]), hosts=int(plan_in["hosts"]), sharding=str(plan_in["sharding"]))
    # Not a refusal: a host numbered outside the group is not one rank 0 waits for.
    if not 0 < host < plan.hosts:
        raise GroupUnsupported(f"host {host}: the learner group at {addr}:{port} has hosts 1 to {plan.hosts - 1} to join")
    beat_start(addr=addr, port=port, generation=generation, host=host)
    ranks = [_follower_start(addr=addr, port=port, rank=rank, parent=os.getpid(), generation=generation)
             for rank in range(host * plan.local, (host + 1) * plan.local)]
    codes = [p.wait() for p in ranks]
    return next((c for c in codes if c), 0)


def dist_store(addr: str, port: int, generation: int | None = None) -> tuple[dist.Store, int]:
    """A client of rank 0's store at addr:port, in group `generation` (None: the newest, for
    another host's `join`), and that generation."""
    import torch.distributed as dist

    base = dist.TCPStore(addr, port, is_master=False, timeout=datetime.timedelta(seconds=600))
    if generation is None:
        base.wait([GENERATION])
        generation = int(base.get(GENERATION))
    return dist.PrefixStore(f"rft/g{generation}", base), generation


if __name__ == "__main__":
    if sys.argv[1] == "join":
        # join ADDR PORT HOST: this host's ranks of the learner group rank 0 opened at ADDR:PORT.
        try:
            sys.exit(host_join(addr=sys.argv[2], port=int(sys.argv[3]), host=int(sys.argv[4])))
        except GroupUnsupported as exc:
            sys.exit(f"learner group: {exc}")  # the message on stderr, exit status 1
    # rank ADDR PORT RANK PARENT GENERATION: a follower rank 0 (or `join`) started on its host.
    follower_main(addr=sys.argv[2], port=int(sys.argv[3]), rank=int(sys.argv[4]), parent=int(sys.argv[5]),
                  generation=int(sys.argv[6]))
    # Told to stop, it has left the group and written what it was asked to: end now, as
    # multiprocessing's children do. The interpreter's own teardown with torch loaded took
    # 3.9 s here and 11.6 s beside five busy loops (most of it collecting torch's objects),
    # longer than rank 0 waits before it kills a follower.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
