"""LoRA adapters (peft): wrap a policy, save and load adapter versions, merge, export.

A LoRA run trains only the adapter; its base stays the run's `model`, frozen. A published
version of such a run is a peft adapter directory (`adapter_config.json` naming the base by
`base_model_name_or_path`, `adapter_model.safetensors`, the tokenizer): megabytes where the
full weights are gigabytes, which is what makes its weight sync cheap. Explorers apply it to
the base they already hold (transformers engine through peft, vLLM through its LoRA support);
`merged_save` folds it into full weights for anything that wants a plain model.
"""

from __future__ import annotations

import json
import os
import shutil
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from kernel.exceptions import ExportFailed, InvalidInput

if TYPE_CHECKING:
    import torch
    from peft import LoraConfig, PeftModel

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


def is_adapter_dir(path: str | Path) -> bool:
    """Whether `path` holds a peft adapter (rather than full weights or a hub id)."""
    return (Path(path) / ADAPTER_CONFIG).is_file()


def adapter_base(path: str | Path) -> str:
    """The base model the adapter at `path` applies to, as recorded when it was saved."""
    data = json.loads((Path(path) / ADAPTER_CONFIG).read_text())
    base = data.get("base_model_name_or_path")
    if not base:
        raise ValueError(f"{path}: the adapter does not name its base model")
    return str(base)


class LoraSettings(Protocol):
    """What an adapter is made of: a run config's `trainer.lora` section
    (kernel.config.AdapterConfig) has these fields."""

    @property
    def rank(self) -> int: ...
    @property
    def alpha(self) -> float: ...
    @property
    def dropout(self) -> float: ...
    @property
    def target_modules(self) -> Sequence[str]: ...


def peft_config_for(lora: LoraSettings) -> LoraConfig:
    """A peft LoraConfig from a run config's `trainer.lora` section."""
    from peft import LoraConfig, TaskType

    return LoraConfig(
        task_type=TaskType.CAUSAL_LM,
        r=int(lora.rank),
        lora_alpha=float(lora.alpha),  # type: ignore[arg-type]  # peft scales by alpha / r: a float works
        lora_dropout=float(lora.dropout),
        target_modules=list(lora.target_modules),
        bias="none",
    )


class AdapterTargetsMissing(InvalidInput, ValueError):
    """None of the adapter's target modules exist in the model."""

    code = "adapter_targets_missing"


def adapter_wrap(*, model: torch.nn.Module, lora: LoraSettings) -> torch.nn.Module:
    """A fresh adapter (B = 0, so at first the policy is exactly its base) on `model`, whose
    own weights are frozen."""
    from peft import get_peft_model

    try:
        return get_peft_model(model, peft_config_for(lora))
    except ValueError as exc:
        if "not found in the base model" in str(exc) or "Target modules" in str(exc):
            raise AdapterTargetsMissing(str(exc), field="trainer.lora.target_modules") from None
        raise


def adapter_load(*, base_model: torch.nn.Module, path: str | Path, trainable: bool) -> PeftModel:
    """The adapter saved at `path` on `base_model` (which it modifies in place)."""
    from peft import PeftModel

    return PeftModel.from_pretrained(base_model, str(path), is_trainable=trainable)


# model → {key as saved in adapter_model.safetensors: the live parameter}, made once per model.
_ADAPTER_KEYS: weakref.WeakKeyDictionary[torch.nn.Module, dict[str, torch.nn.Parameter]] = weakref.WeakKeyDictionary()


def adapter_tensors(model: torch.nn.Module) -> dict[str, torch.nn.Parameter] | None:
    """The default adapter's live parameters under the keys peft saves them by, or None if
    they cannot be told apart. peft's own `get_peft_model_state_dict` and
    `set_peft_model_state_dict` walk every module and remap every key on each call (about
    0.2 s each for a 12-layer model, more than moving a rank-16 adapter's megabytes): this
    asks peft once which keys it writes, matches them to parameters by storage, and keeps
    the map for the life of the model."""
    keys = _ADAPTER_KEYS.get(model)
    if keys is None:
        from peft import get_peft_model_state_dict

        by_ptr = {p.data_ptr(): p for p in model.parameters()}
        keys = {}
        for key, tensor in get_peft_model_state_dict(model).items():
            param = by_ptr.get(tensor.data_ptr())
            if param is None or param.shape != tensor.shape:
                return None
            keys[key] = param
        _ADAPTER_KEYS[model] = keys
    return keys


def adapter_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """What adapter_model.safetensors holds for `model` (detached, contiguous)."""
    keys = adapter_tensors(model)
    if keys is None:
        from peft import get_peft_model_state_dict

        return {k: v.detach().contiguous() for k, v in get_peft_model_state_dict(model).items()}
    return {k: p.detach().contiguous() for k, p in keys.items()}


def adapter_weights_apply(*, model: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> bool:
    """Copy an adapter's saved tensors into the live adapter of `model` in place; False
    when their keys or shapes are not exactly the live adapter's (nothing is changed)."""
    import torch

    keys = adapter_tensors(model)
    if keys is None or set(tensors) != set(keys) or any(keys[k].shape != v.shape for k, v in tensors.items()):
        return False
    with torch.no_grad():
        for key, value in tensors.items():
            keys[key].copy_(value)
    return True


def adapter_weights_load(*, model: torch.nn.Module, path: str | Path) -> None:
    """Replace the adapter weights of a peft `model` with those saved at `path` (same
    rank and targets): the cheap path for an explorer moving from one version to the next."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    tensors = load_file(str(Path(path) / ADAPTER_WEIGHTS))
    if adapter_weights_apply(model=model, tensors=tensors):
        return
    result = set_peft_model_state_dict(model, tensors)
    unexpected = [k for k in getattr(result, "unexpected_keys", []) if "lora_" in k]
    if unexpected:
        raise ValueError(f"{path}: adapter weights do not fit the loaded adapter ({unexpected[0]} …)")


def adapter_save(*, model: torch.nn.Module, out: str | Path) -> Path:
    """The files `PeftModel.save_pretrained` writes for the default adapter (its weights as
    safetensors, its config in inference mode naming the base), without the model card:
    peft renders a README.md from a Jinja template on every save, which took longer than
    writing a rank-16 adapter of a 100M model (bench/weight_sync) and is no use to an
    explorer."""
    import copy

    from safetensors.torch import save_file

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    state = adapter_state(model)
    save_file(state, str(out / ADAPTER_WEIGHTS), metadata={"format": "pt"})
    config = copy.copy(model.peft_config["default"])
    if not config.base_model_name_or_path:
        config.base_model_name_or_path = model.base_model.model.__dict__.get("name_or_path") or None
    config.inference_mode = True
    config.save_pretrained(str(out))
    return out


def is_adapter_model(model: object) -> bool:
    try:
        from peft import PeftModel
    except ImportError:
        return False
    return isinstance(model, PeftModel)


def atomic_dir(out: Path) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    return tmp


def atomic_dir_commit(tmp: Path, out: Path) -> Path:
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    return out


def merged_save(*, adapter_path: str | Path, out: str | Path, base: str | None = None,
                dtype: torch.dtype | None = None) -> Path:
    """Full weights (base + adapter folded in) as a save_pretrained directory with the
    tokenizer; written atomically."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = Path(out)
    base = base or adapter_base(adapter_path)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=dtype or torch.float32)
    merged = adapter_load(base_model=model, path=adapter_path, trainable=False).merge_and_unload()
    tmp = atomic_dir(out)
    merged.save_pretrained(tmp, safe_serialization=True)
    tokenizer_source = adapter_path if (Path(adapter_path) / "tokenizer_config.json").exists() else base
    AutoTokenizer.from_pretrained(tokenizer_source).save_pretrained(tmp)
    return atomic_dir_commit(tmp, out)


def model_export(*, source: str | Path, out: str | Path, merged: bool) -> Path:
    """Copy a version's weights to `out`: a LoRA version as its adapter (small; runs on its
    base) or, `merged`, folded into full weights; a full-weight version is copied whole."""
    source, out = Path(source), Path(out)
    if not source.is_dir():
        raise ExportFailed(f"{source} is not a saved model directory (is the run's storage mounted here?)")
    if merged and is_adapter_dir(source):
        return merged_save(adapter_path=source, out=out)
    tmp = atomic_dir(out)
    shutil.copytree(source, tmp)
    return atomic_dir_commit(tmp, out)
