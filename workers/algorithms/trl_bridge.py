"""Everything that touches TRL's internals, in one place.

We do not let TRL drive training (its `training_step` would generate, its data loaders want
a dataset): we build each TRL trainer once around our resident model, then feed its
`compute_loss` with the inputs dict its own pipeline would have built, and step the
optimizer ourselves. That keeps the numerics TRL's, and everything below leans on private
details of TRL 1.16 (the inputs dict's keys, `_metrics`, `_get_per_token_logps_and_entropies`,
`current_gradient_accumulation_steps`). `tests/trainer/test_trl_bridge.py` pins each of them,
so an upgrade that moves them fails there, loudly, before a run trains on wrong numbers.
"""

from __future__ import annotations

import functools
import logging
import tempfile
import threading
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ParamSpec, TypeAlias, TypeVar

import torch

from kernel.exceptions import UpstreamFailed

if TYPE_CHECKING:
    from datasets import Dataset
    from transformers import PreTrainedTokenizerBase
    from trl import DPOTrainer, GRPOTrainer, SFTTrainer

# The TRL trainers the bridge builds and asks for losses.
TrlTrainer: TypeAlias = "GRPOTrainer | DPOTrainer | SFTTrainer"

log = logging.getLogger(__name__)

TRL_VERSION = "1.16.0"

# transformers' TrainingArguments (every TRL config) resets accelerate's process-wide
# AcceleratorState when it is built, and TRL's losses read that state. Where two learners or
# a learner and the reward worker share a process (the embedded default: `rft_serve` runs two
# runs' trainers as threads), one building a trainer under the other's loss failed its step
# ("`AcceleratorState` object has no attribute `_mixed_precision`"). Building a TRL trainer or
# config and computing a loss with one hold this lock.
TRL_STATE_LOCK = threading.RLock()

_Built = TypeVar("_Built")
_Args = ParamSpec("_Args")


def _holding_trl_state(build: Callable[_Args, _Built]) -> Callable[_Args, _Built]:
    """`build` (a TRL config and trainer) runs holding TRL_STATE_LOCK, whoever calls it."""

    @functools.wraps(build)
    def held(*args: _Args.args, **kwargs: _Args.kwargs) -> _Built:
        with TRL_STATE_LOCK:
            return build(*args, **kwargs)

    return held


class TrlApiMoved(UpstreamFailed, RuntimeError):
    """The installed TRL is not the one this bridge was written and tested against."""


def trl_check() -> str:
    import datasets
    import trl

    # Our dummy datasets are one row; their progress bars are noise in worker logs.
    datasets.disable_progress_bars()

    if trl.__version__ != TRL_VERSION:
        raise TrlApiMoved(
            f"workers/algorithms/trl_bridge.py is written against trl=={TRL_VERSION}, found {trl.__version__}; "
            "run tests/trainer/test_trl_bridge.py and update the bridge before training"
        )
    version: str = trl.__version__
    return version


@dataclass(frozen=True)
class LossParams:
    """The run config's trainer section, as the bridge needs it (no Django types here)."""

    learning_rate: float = 1e-5
    loss_type: str = "dapo"
    beta: float = 0.0
    epsilon: float = 0.2
    epsilon_high: float | None = None
    max_grad_norm: float = 1.0
    scale_rewards: str = "group"
    max_completion_length: int = 64
    dpo_beta: float = 0.1
    total_steps: int = 100
    seed: int = 0


def _common_args(params: LossParams) -> dict[str, object]:
    # CPU-safe, quiet, and nothing written unless we write it.
    return {
        "output_dir": tempfile.mkdtemp(prefix="rft-trl-"),
        "use_cpu": not torch.cuda.is_available(),
        "bf16": False,
        "fp16": False,
        "gradient_checkpointing": False,
        "learning_rate": params.learning_rate,
        "lr_scheduler_type": "constant",
        "max_grad_norm": params.max_grad_norm,
        "report_to": [],
        "save_strategy": "no",
        "logging_strategy": "no",
        "seed": params.seed,
        "gradient_accumulation_steps": 1,
        "remove_unused_columns": False,
        "dataloader_num_workers": 0,
        "disable_tqdm": True,
    }


def _dummy_prompt_dataset(n: int) -> Dataset:
    from datasets import Dataset

    return Dataset.from_dict({"prompt": ["x"] * n})


# ----------------------------------------------------------------------------- GRPO


@_holding_trl_state
def grpo_trainer_build(
    *, model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, params: LossParams, num_generations: int = 2,
    batch_size: int = 2, rollout_func: Callable[..., Mapping[str, object]] | None = None,
    reward_funcs: Sequence[Callable[..., list[float]]] | None = None,
) -> GRPOTrainer:
    """A GRPOTrainer around `model` that we only ask for losses. `num_generations` and
    `batch_size` matter only to TRL's own generation path (used by tests as the oracle)."""
    from trl import GRPOConfig, GRPOTrainer

    trl_check()
    args = GRPOConfig(
        **_common_args(params),
        per_device_train_batch_size=batch_size,
        num_generations=num_generations,
        max_completion_length=params.max_completion_length,
        loss_type=params.loss_type,
        beta=params.beta,
        epsilon=params.epsilon,
        epsilon_high=params.epsilon_high,
        scale_rewards=params.scale_rewards,
        importance_sampling_level="sequence" if params.loss_type == "luspo" else "token",
        log_completions=False,
        # Stored rollout logprobs are the raw model distribution's (STACK-NOTES: they match a
        # plain forward pass), so the trainer scores at temperature 1 to compare like with like.
        temperature=1.0,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=reward_funcs or (lambda completions, **_: [0.0] * len(completions)),
            args=args,
            train_dataset=_dummy_prompt_dataset(max(batch_size, num_generations)),
            processing_class=tokenizer,
            rollout_func=rollout_func,
        )
    # We step once per batch, never accumulate: TRL divides the loss by this.
    trainer.current_gradient_accumulation_steps = 1
    return trainer


def _pad(seqs: list[list[int]] | list[list[float]], *, value: float, side: str, dtype: torch.dtype) -> torch.Tensor:
    from trl.trainer.utils import pad

    return pad([torch.tensor(s, dtype=dtype) for s in seqs], padding_value=value, padding_side=side)


def _on_model(trainer: TrlTrainer, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The batch's tensors on the device of the trainer's model (built on the CPU; a model
    on a GPU — cuda:rank in a learner group — takes them there)."""
    device = next(trainer.model.parameters()).device
    for key, value in list(inputs.items()):
        if isinstance(value, torch.Tensor) and value.device != device:
            inputs[key] = value.to(device)
    return inputs


def grpo_inputs(
    *, trainer: GRPOTrainer, prompt_ids: list[list[int]], completion_ids: list[list[int]],
    old_logprobs: list[list[float]] | None, advantages: torch.Tensor,
    action_masks: list[list[int]] | None = None,
) -> dict[str, torch.Tensor]:
    """The dict `GRPOTrainer._generate_and_score_completions` returns, built from stored
    rollouts: prompts left-padded, completions right-padded, the rollout logprobs as π_old.

    `action_masks` (one 0/1 per completion token) goes in as TRL's `tool_mask`, which its
    loss multiplies into the completion mask everywhere: the loss, the sequence-level
    importance weights, the entropy and clipping metrics. The token count the dapo/cispo/
    vespo losses divide by (`num_items_in_batch`) counts action tokens only, and the stored
    logprobs of masked tokens are replaced by 0 so a placeholder there (an environment's
    0, or anything) never reaches a ratio (exp of a huge difference times a zero mask is NaN).
    """
    pad_id = trainer.processing_class.pad_token_id
    completion_mask = _pad([[1] * len(c) for c in completion_ids], value=0, side="right", dtype=torch.long)
    inputs: dict[str, torch.Tensor] = {
        "prompt_ids": _pad(prompt_ids, value=pad_id, side="left", dtype=torch.long),
        "prompt_mask": _pad([[1] * len(p) for p in prompt_ids], value=0, side="left", dtype=torch.long),
        "completion_ids": _pad(completion_ids, value=pad_id, side="right", dtype=torch.long),
        "completion_mask": completion_mask,
        "advantages": advantages.to(torch.float32),
        "num_items_in_batch": completion_mask.sum(),
    }
    if action_masks is not None:
        for mask, completion in zip(action_masks, completion_ids, strict=True):
            if len(mask) != len(completion):
                raise ValueError(f"an action mask has {len(mask)} entries for {len(completion)} completion tokens")
        tool_mask = _pad(action_masks, value=0, side="right", dtype=torch.long)
        inputs["tool_mask"] = tool_mask
        inputs["num_items_in_batch"] = (completion_mask * tool_mask).sum()
    if old_logprobs is not None:
        old = _pad(old_logprobs, value=0.0, side="right", dtype=torch.float32)
        if action_masks is not None:
            old = old.masked_fill(inputs["tool_mask"] == 0, 0.0)
        inputs["old_per_token_logps"] = old
    return _on_model(trainer, inputs)


def _fused_head(model: torch.nn.Module, *, temperature: float = 1.0) -> None:
    """TRL scores tokens through a patched forward (`fused_lm_head=True`); a model we bring
    (our reference, loaded from the run's v0) needs the same patch, once."""
    from trl.trainer.utils import add_fused_lm_head

    if not getattr(model, "_rft_fused_head", False):
        add_fused_lm_head(model, temperature=temperature)
        model._rft_fused_head = True


# The fused head's tiles where TRL has no Triton kernel (the CPU): tokens × vocabulary
# columns per projection. TRL's own (4096 × 32768, sized for a GPU) make one fp32 tile of
# a whole CPU batch by its whole vocabulary (4 × 96 tokens × 16k: 25 MB), and its torch
# fallback holds about eight tensors of the tile's size at once (the scaled logits, their
# exp, the products), in the forward and again in the backward: the largest transient of
# a LoRA step. Tiles of 256 × 4096 (4 MB) cut that to a few MB; the online logsumexp over
# vocabulary chunks gives the same logprobs and gradients within float rounding
# (tests/trainer/test_trl_bridge.py).
CPU_HEAD_TOKENS = 256
CPU_HEAD_VOCAB = 4096


def fused_head_tiles(*, tokens: int, vocab: int) -> tuple[int, int]:
    """Set TRL's fused-head tile (tokens per tile, vocabulary columns per tile) for this
    process; returns the previous pair. TRL reads both at each call."""
    from trl.kernels import chunked_logprob
    from trl.trainer import utils

    before = (chunked_logprob.TOKEN_CHUNK_SIZE, utils._CHUNKED_LOGPROB_CHUNK_SIZE)
    chunked_logprob.TOKEN_CHUNK_SIZE = tokens
    utils._CHUNKED_LOGPROB_CHUNK_SIZE = vocab
    return before


def fused_head_tiles_for(device: torch.device | str) -> None:
    """Small tiles where the head runs TRL's torch fallback; TRL's on a Triton device."""
    from trl.kernels.chunked_logprob import _use_triton

    if not _use_triton(torch.device(device)):
        fused_head_tiles(tokens=CPU_HEAD_TOKENS, vocab=CPU_HEAD_VOCAB)


def reference_adapter_drop(model: torch.nn.Module) -> None:
    """Remove the frozen "ref" adapter TRL adds beside a pre-existing one when beta > 0
    (its reference is then that copy; ours is the base with the adapter off)."""
    if "ref" in getattr(model, "peft_config", {}):
        model.delete_adapter("ref")
        model.set_adapter("default")


@torch.no_grad()
def grpo_ref_logps(*, trainer: GRPOTrainer, ref_model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """Per-token logprobs of the completions under the reference model, as TRL computes them.
    `ref_model` may be the trainer's own (peft) model under `disable_adapter()`: TRL has
    patched its base already."""
    if ref_model is not trainer.model:
        _fused_head(ref_model, temperature=trainer.temperature)
    input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    pixels = {k: inputs[k] for k in ("pixel_values", "pixel_attention_mask", "image_grid_thw", "image_sizes", "num_images")
              if k in inputs}
    logps, _, _ = trainer._get_per_token_logps_and_entropies(
        ref_model, input_ids, attention_mask, inputs["completion_ids"].size(1), **pixels
    )
    return logps


def _metrics_drain(trainer: TrlTrainer) -> dict[str, float]:
    """The last value of each metric TRL logged during the call, then forget them (TRL
    keeps appending until its own `log`, which we never call)."""
    out: dict[str, float] = {}
    for mode in ("train", "eval"):
        for name, values in trainer._metrics[mode].items():
            if values:
                out[name] = float(values[-1])
        trainer._metrics[mode].clear()
    return out


def grpo_loss(*, trainer: GRPOTrainer, model: torch.nn.Module, inputs: dict[str, torch.Tensor]
              ) -> tuple[torch.Tensor, dict[str, float]]:
    loss = trainer.compute_loss(model, inputs)
    m = _metrics_drain(trainer)
    metrics = {"entropy": m.get("entropy"), "kl": m.get("kl")}
    if "clip_ratio/region_mean" in m:
        metrics["clip_fraction"] = m["clip_ratio/region_mean"]
    elif "cispo_clip_ratio" in m:
        metrics["clip_fraction"] = m["cispo_clip_ratio"]
    return loss, {k: v for k, v in metrics.items() if v is not None}


# ----------------------------------------------------------------------------- DPO


@_holding_trl_state
def dpo_trainer_build(
    *, model: torch.nn.Module, ref_model: torch.nn.Module | None, tokenizer: PreTrainedTokenizerBase, params: LossParams,
    train_dataset: Dataset | None = None, batch_size: int = 2
) -> DPOTrainer:
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    trl_check()
    args = DPOConfig(
        **_common_args(params),
        per_device_train_batch_size=batch_size,
        beta=params.dpo_beta,
        loss_type=["sigmoid"],
        max_length=None,
        precompute_ref_log_probs=False,
    )
    dataset = train_dataset or Dataset.from_dict({"prompt": ["a"], "chosen": ["b"], "rejected": ["c"]})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = DPOTrainer(model=model, ref_model=ref_model, args=args, train_dataset=dataset, processing_class=tokenizer)
    trainer.current_gradient_accumulation_steps = 1
    return trainer


def dpo_inputs(
    *, trainer: DPOTrainer, pairs: list[tuple[list[int], list[int], list[int]]],
    action_masks: list[tuple[list[int] | None, list[int] | None]] | None = None,
) -> dict[str, torch.Tensor]:
    """(prompt_ids, chosen_ids, rejected_ids) triples through TRL's preference collator.

    `action_masks`: per pair, the chosen and the rejected completion's action mask (None: all
    the model's own). A token under mask 0 leaves TRL's `completion_mask`: its label becomes
    -100 and it adds nothing to either sequence's summed logprob, hence to the loss, the
    gradient or the metrics (the collator lays rows out right-padded, chosen rows first)."""
    inputs = trainer.data_collator(
        [{"prompt_ids": p, "chosen_ids": c, "rejected_ids": r} for p, c, r in pairs]
    )
    if action_masks is None:
        return _on_model(trainer, inputs)
    completion_mask = inputs["completion_mask"]
    n = len(pairs)
    for i, ((p, c, r), masks) in enumerate(zip(pairs, action_masks, strict=True)):
        for row, ids, mask in ((i, c, masks[0]), (n + i, r, masks[1])):
            if mask is None:
                continue
            if len(mask) != len(ids):
                raise ValueError(f"an action mask has {len(mask)} entries for {len(ids)} completion tokens")
            completion_mask[row, len(p) : len(p) + len(ids)] *= torch.tensor([1 if m else 0 for m in mask],
                                                                             dtype=completion_mask.dtype)
    return _on_model(trainer, inputs)


def dpo_loss(*, trainer: DPOTrainer, model: torch.nn.Module, inputs: dict[str, torch.Tensor]
             ) -> tuple[torch.Tensor, dict[str, float]]:
    loss = trainer.compute_loss(model, inputs)
    m = _metrics_drain(trainer)
    metrics = {
        "reward_accuracy": m.get("rewards/accuracies"),
        "reward_margin": m.get("rewards/margins"),
        "entropy": m.get("entropy"),
    }
    return loss, {k: v for k, v in metrics.items() if v is not None}


# ----------------------------------------------------------------------------- SFT


@_holding_trl_state
def sft_trainer_build(
    *, model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, params: LossParams,
    train_dataset: Dataset | None = None, batch_size: int = 2
) -> SFTTrainer:
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    trl_check()
    args = SFTConfig(
        **_common_args(params),
        per_device_train_batch_size=batch_size,
        max_length=None,
        completion_only_loss=True,
        packing=False,
    )
    dataset = train_dataset or Dataset.from_dict({"prompt": ["a"], "completion": ["b"]})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = SFTTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer)
    trainer.current_gradient_accumulation_steps = 1
    return trainer


def sft_inputs(
    *, trainer: SFTTrainer, rows: list[tuple[list[int], list[int]]], action_masks: list[list[int] | None] | None = None
) -> dict[str, torch.Tensor]:
    """(prompt_ids, completion_ids) pairs through TRL's LM collator, loss on the completion only.

    A completion token whose action mask is 0 is labelled -100 like the prompt: TRL's SFT loss,
    its token count and its entropy and accuracy metrics all skip such labels."""
    masks = action_masks or [None] * len(rows)
    examples = []
    for (p, c), mask in zip(rows, masks, strict=True):
        if mask is not None and len(mask) != len(c):
            raise ValueError(f"an action mask has {len(mask)} entries for {len(c)} completion tokens")
        # The labels TRL's dataset preparation builds (`build_labels`): -100 outside the completion.
        labels = [t if mask is None or mask[i] else -100 for i, t in enumerate(c)]
        examples.append({"input_ids": p + c, "labels": [-100] * len(p) + labels})
    return _on_model(trainer, trainer.data_collator(examples))


def sft_loss(*, trainer: SFTTrainer, model: torch.nn.Module, inputs: dict[str, torch.Tensor]
             ) -> tuple[torch.Tensor, dict[str, float]]:
    loss = trainer.compute_loss(model, dict(inputs), num_items_in_batch=None)
    m = _metrics_drain(trainer)
    metrics = {"entropy": m.get("entropy"), "token_accuracy": m.get("mean_token_accuracy")}
    return loss, {k: v for k, v in metrics.items() if v is not None}


# ----------------------------------------------------------------------------- optimizer


def optimizer_build(*, trainer: TrlTrainer, total_steps: int, optimizer: str = "adamw"
                    ) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    """The optimizer and scheduler the trainer would use (AdamW from TrainingArguments;
    optimizer adamw_8bit: transformers' `adamw_bnb_8bit`, bitsandbytes' AdamW8bit)."""
    if optimizer == "adamw_8bit":
        trainer.args.optim = "adamw_bnb_8bit"
    trainer.create_optimizer_and_scheduler(num_training_steps=max(1, total_steps))
    return trainer.optimizer, trainer.lr_scheduler
