"""A learner on PyTorch's own sharding, FSDP2 (`fully_shard`) or, sharded `none`,
DistributedDataParallel: sharding a learner that is the same on every rank (`learner_shard`),
loading only a rank's rows of a model (`model_sharded_load`), sharded snapshots
(`sharded_save`/`sharded_load`, torch.distributed.checkpoint), and the whole model gathered
from the shards for a version. The process group they run in is workers/algorithms/gang.py's.

Every rank of a learner gang on its shards only, rank 0 of the train worker included.

A rank builds its learner once the gang is joined (the shards are the mesh's), the same way
on every rank (`learner_sharded_build`): the policy, the reference model and a fresh adapter
are built on the meta device, sharded (FSDP2), and given storage for this rank's rows only,
read from the run's safetensors files (`model_sharded_load`).
No rank holds the whole model during the load or a step. The ranks' trainable state agrees
without a broadcast: the weights are the same files, and a fresh adapter draws the same
numbers on every rank from the run's seed, set just before it is made (as one process does:
nothing between its seed and its adapter draws a number).

Rank 0 loads so (`rank0_sharded_fits`) when its learner starts from the run's model (a new
run, or a learner gang's own sharded snapshot, loaded into the shards after), or, after lost
trainer state, from a published version (`LearnerBuild.source`, which the followers read from
the gang's spec): of full weights, every rank reads its rows of the version (the reference
model's of the run's model); an adapter directory, every rank builds the run's model with a
fresh adapter and copies its rows of the saved adapter in (`adapter_into_shards`). A learner
that starts from a one-process snapshot with its optimizer is still loaded whole on rank 0 and
sharded from there (`learner_shard(from_rank0=True)`; a learner gang snapshots sharded).

A published version is a whole model. With full weights and the checkpoint sync it is
written from the shards (`whole_write`): the safetensors header is laid out from the
weights' shapes, then every rank gathers one tensor at a time and rank 0 writes it and drops
it, so no rank ever holds the whole model (bench/sharding --version: ~64 MB above the RSS
before it on a 350M model, against 1.1 GB gathered whole). Otherwise (an adapter, the memory
handover, the NCCL broadcast) rank 0 keeps a skeleton of the policy on the meta device
(`model_skeleton`); every rank gathers the weights it holds one tensor at a time
(`whole_gather`: all of them, or only the adapter's under LoRA, whose base is the run's
model), rank 0 assigns them into the skeleton (`whole_assign`) for the version's writer, and
lets go of them when the gang's next step starts (`whole_release`).
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from workers.weights.adapters import ADAPTER_WEIGHTS, adapter_wrap, is_adapter_dir
from workers.algorithms.learner import Learner, Shard, model_blocks
from workers.precision import precision_dtype
from workers.vision import is_vision_model

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import MixedPrecisionPolicy
    from transformers import PreTrainedTokenizerBase

    from kernel.config import AdapterConfig, RunConfig
    from workers.algorithms.batch import TrainBatch
    from workers.algorithms.trainee import LearnerSpec

SHARDINGS = ("full", "grad_op", "none")


# ----------------------------------------------------------------------------- sharding a learner



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
    in a gang every rank its shard (all ranks call it), in one process the whole."""
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




def sharded_load_fits(sharding: str, *, model: str) -> bool:
    """Whether a learner gang's followers load only their shards of the run's model
    (`model_sharded_load`): sharded full or grad_op, a causal LM (a vision-language model is
    loaded whole, then sharded)."""
    path = Path(model)
    if sharding == "none" or not ((path / "model.safetensors").exists() or (path / "model.safetensors.index.json").exists()):
        return False  # a model name the hub resolves is loaded whole (from_pretrained finds its files)

    return not is_vision_model(model)


@dataclass(frozen=True)
class LearnerBuild:
    """What a rank builds its learner from once the gang is joined."""

    cfg: RunConfig
    spec: LearnerSpec
    tokenizer: PreTrainedTokenizerBase
    # The policy's weights where they are not the run's model: a published version of full
    # weights (a run resuming after its trainer state was lost). Every rank reads its rows of
    # it; the reference model is still the run's model.
    source: str | None = None


def rank0_sharded_fits(*, sharding: str, model: str, source: str, lora: bool = False) -> bool:
    """Whether rank 0 loads only its shards too: its followers do (`sharded_load_fits`) and
    its learner starts from the run's model, or from a published version of full weights
    (`source`: what it would otherwise load whole). Not yet from an adapter folder or a
    one-process snapshot (those are loaded whole on rank 0, then sharded)."""
    if not sharded_load_fits(sharding, model=model):
        return False
    if lora:
        return source == model or is_adapter_dir(source)
    return source == model or (Path(source, "config.json").is_file() and sharded_load_fits(sharding, model=source))


def gang_device() -> str:
    """The device type of this rank's shards: a GPU per rank where there are GPUs (each
    rank's current device), else the CPU."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def learner_sharded_build(build: LearnerBuild, *, world: int, sharding: str) -> Learner:
    """This rank's learner on its shards only of the run's model (and of the reference
    model; with an adapter, of the frozen base), in the process group just joined."""
    from torch.distributed.device_mesh import init_device_mesh

    cfg, spec = build.cfg, build.spec
    mesh = init_device_mesh(gang_device(), (world,))
    # An adapter's base in the training precision, full weights in fp32: as a whole load.
    dtype = precision_dtype(spec.precision) if spec.lora is not None else torch.float32
    torch.manual_seed(cfg.seed)  # every rank's fresh adapter the same, and one process's
    adapter = build.source if build.source is not None and is_adapter_dir(build.source) else None
    weights = cfg.model if adapter is not None else build.source or cfg.model
    model = model_sharded_load(weights, mesh=mesh, reshard=sharding == "full",
                               precision=spec.precision, dtype=dtype, lora=spec.lora)
    if adapter is not None:
        adapter_into_shards(model, adapter)
    ref = (model_sharded_load(cfg.model, mesh=mesh, reshard=True, precision=spec.precision)
           if spec.needs_ref_model else None)
    return Learner(spec=spec, model=model, tokenizer=build.tokenizer, ref_model=ref)


def adapter_into_shards(model: torch.nn.Module, folder: str) -> None:
    """The adapter saved in `folder` into this rank's shards of `model`'s adapter (every rank
    calls it; each reads the adapter's file whole: megabytes, not the model). Matched by the
    names peft saves (the adapter's own name left out); one that does not fit is refused."""
    from safetensors.torch import load_file
    from torch.distributed.tensor import DTensor, distribute_tensor

    saved = load_file(str(Path(folder) / ADAPTER_WEIGHTS))
    live = {name.replace(".default.", "."): p for name, p in model.named_parameters() if "lora_" in name}
    misfit = sorted(set(live) ^ set(saved)) or [k for k in live if tuple(live[k].shape) != tuple(saved[k].shape)]
    if misfit:
        raise ValueError(f"{folder}: the adapter does not fit the run's ({misfit[0]} …)")
    with torch.no_grad():
        for key, param in live.items():
            value = saved[key].to(param.dtype)
            if isinstance(param, DTensor):
                local = param.to_local()
                # Each rank cuts its own rows from the whole it read: no collective.
                local.copy_(distribute_tensor(value.to(local.device), param.device_mesh, param.placements,
                                              src_data_rank=None).to_local())
            else:
                param.copy_(value)


def model_skeleton(*, cfg: RunConfig, spec: LearnerSpec) -> torch.nn.Module:
    """The run's policy as a version holds it (the model, with the run's adapter under
    LoRA), every weight on the meta device: no storage until `whole_assign`. Buffers that
    are computed, not saved (rotary `inv_freq`), are real: as a whole load makes them."""
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    path = Path(cfg.model)
    dtype = precision_dtype(spec.precision) if spec.lora is not None else torch.float32
    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path), dtype=dtype)
    model.tie_weights()  # outside the context (see model_sharded_load)
    with contextlib.suppress(OSError):
        # A version carries the model's own generation settings, as from_pretrained reads them.
        model.generation_config = GenerationConfig.from_pretrained(path)
    if spec.lora is not None:
        with init_empty_weights(include_buffers=False):
            model = adapter_wrap(model=model, lora=spec.lora)
    model.eval()
    return model


def whole_gather(learner: Learner) -> dict[str, torch.Tensor]:
    """The weights a version holds, whole, on rank 0's CPU (the other ranks get an empty
    dict): every rank calls it, in the same order of tensors. Under LoRA the adapter's
    only (the base is the run's model); else the whole state dict. A tied weight is
    gathered once and appears under each of its names, as one tensor."""
    from torch.distributed.tensor import DTensor

    model = learner.model
    rank0 = not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0
    trainable = {id(p) for p in model.parameters() if p.requires_grad}
    out: dict[str, torch.Tensor] = {}
    seen: dict[int, torch.Tensor] = {}
    for name, value in model.state_dict(keep_vars=True).items():
        if learner.adapter and id(value) not in trainable:
            continue
        if id(value) in seen:
            if rank0:
                out[name] = seen[id(value)]
            continue
        whole = value.full_tensor() if isinstance(value, DTensor) else value
        if rank0:
            seen[id(value)] = out[name] = whole.detach().to("cpu", copy=True)
        del whole  # a follower's gathered copy goes at once
    return out


_SAFETENSORS_NAMES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
                      torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
                      torch.bool: "BOOL"}


def _version_entries(learner: Learner) -> list[tuple[str, torch.Tensor]]:
    """(name, tensor) of what a full-weight version holds, in `whole_gather`'s order (the
    model's state dict; a tied weight once, under its first name, as save_pretrained keeps it)."""
    seen: set[int] = set()
    out = []
    for name, value in learner.model.state_dict(keep_vars=True).items():
        if id(value) not in seen:
            seen.add(id(value))
            out.append((name, value))
    return out


def whole_write(learner: Learner, path: Path) -> int:
    """The policy's whole weights written to `path` as one safetensors file, gathered one
    tensor at a time and written at once (rank 0 holds one whole tensor at most, where
    `whole_gather` holds them all); every rank calls it, in the same order of collectives as
    `whole_gather` (a follower's `whole` op serves either). Full weights only (under LoRA a
    version is the adapter: `whole_gather`). Returns the bytes written (0 on the others)."""
    from torch.distributed.tensor import DTensor

    rank0 = not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0
    entries = _version_entries(learner)
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, value in entries:
        size = value.numel() * value.element_size()
        header[name] = {"dtype": _SAFETENSORS_NAMES[value.dtype], "shape": list(value.shape),
                        "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data starts 8-byte aligned
    with contextlib.ExitStack() as stack:
        fh = stack.enter_context(open(path, "wb")) if rank0 else None
        if fh is not None:
            fh.write(len(raw).to_bytes(8, "little") + raw)
        for _, value in entries:
            whole = value.full_tensor() if isinstance(value, DTensor) else value
            if fh is not None:
                fh.write(whole.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy().data)
            del whole  # gone before the next one is gathered
    return 8 + len(raw) + offset if rank0 else 0


def whole_assign(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> torch.nn.Module:
    """`model` (a `model_skeleton`) holding `state`'s tensors, without a copy; the weights
    `state` lacks (an adapter's base) stay on the meta device."""
    missing_or_unexpected = model.load_state_dict(state, strict=False, assign=True)
    if missing_or_unexpected.unexpected_keys:
        raise RuntimeError(f"the gathered version has weights its model lacks: {missing_or_unexpected.unexpected_keys[:5]}")
    return model


def whole_release(model: torch.nn.Module) -> None:
    """Give back what `whole_assign` put into `model`: each weight back on the meta device
    (a tied weight stays one parameter)."""
    replaced: dict[int, torch.nn.Parameter] = {}
    for name, param in list(model.named_parameters(remove_duplicate=False)):
        if param.device.type == "meta":
            continue
        owner, _, leaf = name.rpartition(".")
        meta = replaced.setdefault(id(param), torch.nn.Parameter(torch.empty_like(param, device="meta"),
                                                                 requires_grad=param.requires_grad))
        setattr(model.get_submodule(owner) if owner else model, leaf, meta)
