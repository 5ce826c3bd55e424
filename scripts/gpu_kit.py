"""What the GPU check's parts share (scripts/gpu_check.py, scripts/gpu_side_by_side.py): the
figure a check prints, the randomly initialised Qwen2 model, the GRPO batch of random tokens and
rftweb's learner on it. A module of its own so that both import it once, whichever runs as the
script."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Figure:
    name: str
    ok: bool
    detail: str = ""
    values: dict[str, float] = field(default_factory=dict)

    def line(self) -> str:
        shown = ", ".join(f"{k} {number(v)}" if isinstance(v, float) else f"{k} {v}" for k, v in self.values.items())
        return f"[{'ok' if self.ok else 'FAIL'}] {self.name}: {shown}{' — ' if shown and self.detail else ''}{self.detail}"


def number(value: float) -> str:
    """1,234.5 for a large figure; three significant digits for a small one (a ratio, seconds)."""
    return f"{value:,.1f}" if abs(value) >= 100 else f"{value:.3g}"


# --- the model and the batch -----------------------------------------------------------------

def model_build(*, shape: dict[str, int], dtype: Any, device: str, seed: int = 0) -> Any:
    """A randomly initialised Qwen2 causal LM of `shape`, built directly on `device`."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(
        vocab_size=shape["vocab_size"], hidden_size=shape["hidden_size"],
        intermediate_size=shape["intermediate_size"], num_hidden_layers=shape["layers"],
        num_attention_heads=shape["heads"], num_key_value_heads=shape["kv_heads"],
        max_position_embeddings=4096, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )
    torch.manual_seed(seed)
    with torch.device(device):
        return AutoModelForCausalLM.from_config(config, dtype=dtype)


def tokenizer_build() -> Any:
    """A small tokenizer for the learner (it reads pad and eos); the rollouts are token ids."""
    from workers.models.tiny import tokenizer_build as build

    return build(texts=[f"{a} + {b} = {a + b}" for a in range(30) for b in range(30)], vocab_size=300)


def rollouts(batch: dict[str, int], *, vocab: int, seed: int = 3) -> list[Any]:
    """A GRPO batch of random tokens whose stored logprobs are a uniform model's, -log(vocab)
    (near a random model's own, so the ratio and the loss depend on the weights)."""
    import math

    import torch

    from workers.algorithms import Rollout

    g = torch.Generator().manual_seed(seed)
    rows = []
    for gi in range(batch["groups"]):
        prompt = torch.randint(10, vocab, (batch["prompt"],), generator=g).tolist()
        for j in range(batch["size"]):
            completion = torch.randint(10, vocab, (batch["completion"],), generator=g).tolist()
            rows.append(Rollout(id=gi * batch["size"] + j, group_id=f"g{gi}", prompt_ids=prompt,
                                completion_ids=completion, logprobs=[-math.log(vocab)] * len(completion),
                                reward=float((j * 7 + gi) % 3)))
    return rows


def batch_tokens(batch: dict[str, int]) -> int:
    return batch["groups"] * batch["size"] * (batch["prompt"] + batch["completion"])


def learner_build(*, model: Any, precision: str, adapter: Any, completion: int) -> Any:
    from workers.algorithms import Learner, LearnerSpec
    from workers.algorithms import trl_bridge as bridge

    spec = LearnerSpec(algorithm="grpo", params=bridge.TrainParams(learning_rate=1e-5,
                                                                    max_completion_length=completion),
                       precision=precision, lora=adapter, algorithm_params={"loss_type": "grpo"})
    return Learner(spec=spec, model=model, tokenizer=tokenizer_build())


def timed_steps(learner: Any, rows: list[Any], *, steps: int, device: str, shard: Any = None) -> tuple[float, float]:
    """One warm-up step, then `steps` timed ones: (seconds a step, the last loss)."""
    import torch

    from workers.algorithms import TrainBatch

    learner.step(TrainBatch(usual=rows), shard=shard)
    if device == "cuda":
        torch.cuda.synchronize()
    started = time.perf_counter()
    loss = 0.0
    for _ in range(steps):
        loss = float(learner.step(TrainBatch(usual=rows), shard=shard)["loss"])
    if device == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - started) / steps, loss


def peak_mb(device: str) -> float:
    import torch

    if device == "cuda":
        return float(torch.cuda.max_memory_allocated()) / 2**20
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
