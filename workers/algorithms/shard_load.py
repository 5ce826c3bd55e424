"""Every rank of a learner group on its shards only, rank 0 of the train worker included.

A rank builds its learner once the group is joined (the shards are the mesh's), the same way
on every rank (`learner_sharded_build`): the policy, the reference model and a fresh adapter
are built on the meta device, sharded (FSDP2), and given storage for this rank's rows only,
read from the run's safetensors files (`workers.algorithms.distributed.model_sharded_load`).
No rank holds the whole model during the load or a step. The ranks' trainable state agrees
without a broadcast: the weights are the same files, and a fresh adapter draws the same
numbers on every rank from the run's seed, set just before it is made (as one process does:
nothing between its seed and its adapter draws a number).

Rank 0 loads so (`rank0_sharded_fits`) when its learner starts from the run's model (a new
run, or a learner group's own sharded snapshot, loaded into the shards after), or, after lost
trainer state, from a published version (`LearnerBuild.source`, which the followers read from
the group's spec): of full weights, every rank reads its rows of the version (the reference
model's of the run's model); an adapter directory, every rank builds the run's model with a
fresh adapter and copies its rows of the saved adapter in (`adapter_into_shards`). A learner
that starts from a one-process snapshot with its optimizer is still loaded whole on rank 0 and
sharded from there (`learner_shard(from_rank0=True)`; a learner group snapshots sharded).

A published version is a whole model. With full weights and the checkpoint sync it is
written from the shards (`whole_write`): the safetensors header is laid out from the
weights' shapes, then every rank gathers one tensor at a time and rank 0 writes it and drops
it, so no rank ever holds the whole model (bench/sharding --version: ~64 MB above the RSS
before it on a 350M model, against 1.1 GB gathered whole). Otherwise (an adapter, the memory
handover, the NCCL broadcast) rank 0 keeps a skeleton of the policy on the meta device
(`model_skeleton`); every rank gathers the weights it holds one tensor at a time
(`whole_gather`: all of them, or only the adapter's under LoRA, whose base is the run's
model), rank 0 assigns them into the skeleton (`whole_assign`) for the version's writer, and
lets go of them when the group's next step starts (`whole_release`).
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from workers.adapters import ADAPTER_WEIGHTS, adapter_wrap, is_adapter_dir
from workers.algorithms import Learner
from workers.algorithms.distributed import model_sharded_load, sharded_load_fits
from workers.precision import precision_dtype

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from kernel.config import RunConfig
    from workers.algorithms.learner import Learner, LearnerSpec


@dataclass(frozen=True)
class LearnerBuild:
    """What a rank builds its learner from once the group is joined."""

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


def group_device() -> str:
    """The device type of this rank's shards: a GPU per rank where there are GPUs (each
    rank's current device), else the CPU."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def learner_sharded_build(build: LearnerBuild, *, world: int, sharding: str) -> Learner:
    """This rank's learner on its shards only of the run's model (and of the reference
    model; with an adapter, of the frozen base), in the process group just joined."""
    from torch.distributed.device_mesh import init_device_mesh

    cfg, spec = build.cfg, build.spec
    mesh = init_device_mesh(group_device(), (world,))
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
