"""The policy a run trains and its reference model, loaded from a run's config: the train
worker's resident learner (workers/trainer/resident.py) and every follower of a learner gang
(workers/trainer/follower.py) load them so. Importing it loads no torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from workers.weights.adapters import adapter_load, adapter_wrap, is_adapter_dir
from workers.precision import precision_dtype
from workers.vision import is_vision_model

if TYPE_CHECKING:
    import torch

    from kernel.config import RunConfig
    from workers.algorithms.trainee import LearnerSpec


def train_device() -> str:
    """Where this process trains: its GPU if it has one."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _load_model(path: str, dtype: torch.dtype | None = None, device: str | None = None) -> torch.nn.Module:
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    auto = AutoModelForImageTextToText if is_vision_model(path) else AutoModelForCausalLM
    return auto.from_pretrained(path, dtype=dtype or torch.float32).to(device or train_device())


def policy_load(*, cfg: RunConfig, spec: LearnerSpec, source: str, device: str | None = None
                 ) -> tuple[torch.nn.Module, torch.nn.Module | None]:
    """(policy, reference model or None) for a run config, its weights from `source` (the
    config's model, a snapshot or a published version). With `trainer.lora` the policy is
    the config's model (frozen; held in the training precision) plus an adapter, fresh or
    loaded from `source`, and there is no reference model: the base is the reference."""

    if spec.lora is None:
        if is_adapter_dir(source):
            raise ValueError(f"{source} holds an adapter but the run's trainer.lora is not set")
        model = _load_model(source, device=device)
        return model, (_load_model(cfg.model, device=device) if spec.needs_ref_model else None)
    base = _load_model(cfg.model, dtype=precision_dtype(spec.precision), device=device)
    if is_adapter_dir(source):
        return adapter_load(base_model=base, path=source, trainable=True), None
    if source != cfg.model:
        raise ValueError(f"{source} holds full weights but the run trains a LoRA adapter on {cfg.model}")
    return adapter_wrap(model=base, lora=spec.lora), None
