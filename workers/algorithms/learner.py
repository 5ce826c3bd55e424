"""GRPO, DPO, SFT and MIX on one resident policy, with TRL computing every loss.

A `Learner` owns the policy, the reference model when the algorithm needs one, the TRL
trainers it borrows `compute_loss` from, and one optimizer over the policy's parameters.
`loss(batch)` is the algorithm's objective on one batch; `step(batch)` is one update.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from workers.algorithms import trl_bridge as bridge
from workers.algorithms.batch import (
    Rollout,
    TrainBatch,
    group_advantages,
    preference_pairs,
    scored,
    trainable,
)

from kernel.algorithms import algorithm_get, algorithm_names
from kernel.exceptions import Conflict
from workers.algorithms.objectives import objective_get

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase, ProcessorMixin

    from kernel.config import AdapterConfig, RunConfig
    from workers.algorithms.distributed import Shard

# The registered algorithms (kernel.algorithms), each with its objective here.
ALGORITHMS = tuple(algorithm_names())


class NothingToTrain(Conflict, ValueError):
    """The batch holds nothing this algorithm can learn from (no tokens, no pairs)."""


# Step metric: 1.0 when the batch carried no learning signal and the optimizer did not step
# (Learner.no_signal), 0.0 when it stepped. Recorded on every step so the run page charts it.
SKIPPED_NO_SIGNAL = "train/skipped_no_signal"


@dataclass
class LearnerSpec:
    algorithm: str
    params: bridge.LossParams = field(default_factory=bridge.LossParams)
    # MIX: (1 − mu)·GRPO(usual) + mu·SFT(expert)
    mu: float = 0.1
    # fp32 | bf16 | fp16 (autocast; workers.precision) and activation recomputation.
    precision: str = "fp32"
    gradient_checkpointing: bool = False
    # The run's `trainer.lora` section, or None for full fine-tuning.
    lora: AdapterConfig | None = None
    # adamw | adamw_8bit (bitsandbytes, CUDA; workers.precision.optimizer_check)
    optimizer: str = "adamw"

    @property
    def needs_ref(self) -> bool:
        return algorithm_get(self.algorithm).needs_reference(beta=self.params.beta)

    @property
    def needs_ref_model(self) -> bool:
        """A separate reference model: not with an adapter, whose base is the reference."""
        return self.needs_ref and self.lora is None


def spec_from_config(cfg: RunConfig) -> LearnerSpec:
    """From an `kernel.config.RunConfig` (pydantic: workers take no Django types here)."""
    t = cfg.trainer
    params = bridge.LossParams(
        learning_rate=t.learning_rate,
        loss_type=t.loss_type,
        beta=t.beta,
        epsilon=t.epsilon,
        epsilon_high=t.epsilon_high,
        max_grad_norm=t.max_grad_norm,
        scale_rewards=t.scale_rewards,
        max_completion_length=cfg.sampling.max_tokens,
        dpo_beta=t.dpo_beta,
        total_steps=cfg.total_steps,
        seed=cfg.seed,
    )
    return LearnerSpec(
        algorithm=str(cfg.algorithm), params=params, mu=t.mu, precision=t.precision,
        gradient_checkpointing=t.gradient_checkpointing, lora=t.lora, optimizer=t.optimizer,
    )


class Learner:
    def __init__(self, *, spec: LearnerSpec, model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase,
                 ref_model: torch.nn.Module | None = None, processor: ProcessorMixin | None = None) -> None:
        self.objective = objective_get(spec.algorithm)  # ValueError naming the known ones
        from workers.adapters import is_adapter_model
        from workers.precision import optimizer_check, precision_check

        self.adapter = is_adapter_model(model)
        if spec.needs_ref and ref_model is None and not self.adapter:
            raise ValueError(f"{spec.algorithm} with these settings needs a reference model")
        self.device = next(model.parameters()).device.type
        precision_check(spec.precision, device=self.device)
        # Peak memory of a CPU step: small logprob tiles (trl_bridge says why); nothing
        # changes on a GPU. Returning freed tensors to the system is the train worker's
        # choice (RFT_TRAINER_CPU_MMAP_THRESHOLD, workers/host_memory.py): it costs time.
        bridge.fused_head_tiles_for(next(model.parameters()).device)
        if self.device == "cpu":
            # In a tuned worker, the heap is also trimmed after each block's backward.
            from workers.algorithms.distributed import model_blocks
            from workers.host_memory import backward_trim

            backward_trim(model_blocks(model))
        optimizer_check(spec.optimizer, device=self.device)
        self.spec = spec
        self.model = model
        # What the losses call: the model itself, or its DistributedDataParallel wrapper in a
        # learner group sharded `none` (FSDP2 shards the model in place).
        self.forward_model: torch.nn.Module = model
        self.tokenizer = tokenizer
        # A vision-language model's processor: the pictures of image prompts become pixel inputs.
        self.processor = processor
        # With an adapter the reference is the base itself (adapter off), never a copy.
        self.ref_model = None if self.adapter else ref_model
        if self.ref_model is not None:
            self.ref_model.eval()
            self.ref_model.requires_grad_(False)
        if spec.gradient_checkpointing:
            # Non-reentrant: works with frozen inputs (a LoRA base) without input grads.
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            model.config.use_cache = False
        p = spec.params
        self.grpo = self.dpo = self.sft = None
        # The TRL trainers whose losses the objective borrows.
        if "grpo" in self.objective.trainers:
            self.grpo = bridge.grpo_trainer_build(model=model, tokenizer=tokenizer, params=p)
        if "dpo" in self.objective.trainers:
            self.dpo = bridge.dpo_trainer_build(model=model, ref_model=self.ref_model, tokenizer=tokenizer, params=p)
        if "sft" in self.objective.trainers:
            self.sft = bridge.sft_trainer_build(model=model, tokenizer=tokenizer, params=p)
        if self.adapter:
            # TRL keeps a frozen copy of a pre-existing adapter as the reference; ours is
            # the base (a resumed adapter's copy would be the trained one, not the start).
            bridge.reference_adapter_drop(model)
        self.optimizer_rebuild()
        self.scaler = torch.amp.GradScaler(self.device) if spec.precision == "fp16" else None
        self.model.train()

    def optimizer_rebuild(self) -> None:
        """A fresh optimizer and scheduler over the model's parameters as they are now (FSDP2
        replaces them with their shards: workers.algorithms.distributed.learner_shard)."""
        primary = self.grpo or self.dpo or self.sft
        assert primary is not None
        primary.optimizer = None
        primary.lr_scheduler = None
        self.optimizer, self.scheduler = bridge.optimizer_build(trainer=primary, total_steps=self.spec.params.total_steps,
                                                                optimizer=self.spec.optimizer)

    @property
    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    # -- objectives -----------------------------------------------------------------

    def grpo_plan(self, rollouts: list[Rollout]) -> tuple[list[Rollout], torch.Tensor]:
        """(the rows the GRPO loss trains on, their advantages): advantages over every scored
        row of the whole batch (a masked one's reward still sets its group's baseline); the
        loss sees only rows with at least one action token. A learner group takes the plan of
        the whole batch on every rank and deals its rows, so the advantages never change."""
        rows = scored(rollouts)
        if not rows:
            raise NothingToTrain("no rollout with a response")
        all_advantages = group_advantages(rows, scale=self.spec.params.scale_rewards)
        keep = [i for i, r in enumerate(rows) if r.action_count > 0]
        if not keep:
            raise NothingToTrain("no rollout with a token the model sampled (every action mask is zero)")
        return [rows[i] for i in keep], all_advantages[keep]

    def grpo_loss(self, rollouts: list[Rollout]) -> tuple[torch.Tensor, dict[str, float]]:
        assert self.grpo is not None
        return self.grpo_loss_on(*self.grpo_plan(rollouts))

    def grpo_loss_on(self, rollouts: list[Rollout], advantages: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        """TRL's GRPO loss on `rollouts` (each with an action token) with these advantages."""
        assert self.grpo is not None
        have_logprobs = all(r.logprobs is not None and len(r.logprobs) == len(r.completion_ids) for r in rollouts)
        masked = any(r.action_mask is not None for r in rollouts)
        inputs = bridge.grpo_inputs(
            trainer=self.grpo,
            prompt_ids=[r.prompt_ids for r in rollouts],
            completion_ids=[r.completion_ids for r in rollouts],
            # Without stored logprobs, TRL's ratio is against the current policy (on-policy).
            old_logprobs=[list(r.logprobs or []) for r in rollouts] if have_logprobs else None,
            advantages=advantages,
            action_masks=[r.trained_mask for r in rollouts] if masked else None,
        )
        inputs.update(self.pixel_inputs(rollouts))
        if self.spec.params.beta > 0:
            inputs["ref_per_token_logps"] = self.reference_logps(inputs)
        loss, metrics = bridge.grpo_loss(trainer=self.grpo, model=self.forward_model, inputs=inputs)
        metrics["advantage_abs_mean"] = float(advantages.abs().mean())
        return loss, metrics

    def pixel_inputs(self, rollouts: list[Rollout]) -> dict[str, torch.Tensor | list[int]]:
        """The pictures of image prompts as the model's pixel inputs, TRL's way (`pixel_values`
        and the processor's other tensors, `num_images` per row); nothing for text rollouts."""
        pictured = [bool(r.images) for r in rollouts]
        if not any(pictured):
            return {}
        if not all(pictured):
            raise ValueError("a batch mixes prompts with and without images; the trainer takes one kind per batch")
        if self.processor is None:
            raise ValueError("rollouts with images need a vision-language model (its processor)")
        from workers.vision import images_open, pixel_inputs

        pixels = pixel_inputs(self.processor, [images_open(r.images or []) for r in rollouts])
        device = next(self.model.parameters()).device
        out: dict[str, torch.Tensor | list[int]] = {k: v.to(device) for k, v in pixels.items()}
        out["num_images"] = [len(r.images or []) for r in rollouts]
        return out

    def reference_logps(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """Per-token logprobs of the completions under the KL reference: the reference
        model, or with an adapter the same model with the adapter switched off."""
        assert self.grpo is not None
        if self.adapter:
            with self.model.disable_adapter():
                return bridge.grpo_ref_logps(trainer=self.grpo, ref_model=self.model, inputs=inputs)
        return bridge.grpo_ref_logps(trainer=self.grpo, ref_model=self.ref_model, inputs=inputs)

    def sft_rows(self, rollouts: list[Rollout]) -> list[Rollout]:
        rows = trainable(rollouts)
        if not rows:
            raise NothingToTrain("no expert rollout with a token to learn (empty, or every action mask zero)")
        return rows

    def sft_loss(self, rollouts: list[Rollout]) -> tuple[torch.Tensor, dict[str, float]]:
        return self.sft_loss_on(self.sft_rows(rollouts))

    def sft_loss_on(self, rollouts: list[Rollout]) -> tuple[torch.Tensor, dict[str, float]]:
        assert self.sft is not None
        inputs = bridge.sft_inputs(
            trainer=self.sft,
            rows=[(r.prompt_ids, r.completion_ids) for r in rollouts],
            action_masks=[r.action_mask for r in rollouts],
        )
        return bridge.sft_loss(trainer=self.sft, model=self.forward_model, inputs=inputs)

    def dpo_pairs(self, rollouts: list[Rollout], preferences: list[tuple[int, int]]) -> list[tuple[Rollout, Rollout]]:
        pairs = preference_pairs(rollouts, preferences=preferences)
        # A pair neither of whose completions has a token the model sampled scores nothing.
        pairs = [(c, r) for c, r in pairs if c.action_count or r.action_count]
        if not pairs:
            raise NothingToTrain("no preference pair (every group tied, no pairwise feedback, or every action mask zero)")
        return pairs

    def dpo_loss(self, rollouts: list[Rollout], preferences: list[tuple[int, int]]) -> tuple[torch.Tensor, dict[str, float]]:
        return self.dpo_loss_on(self.dpo_pairs(rollouts, preferences))

    def dpo_loss_on(self, pairs: list[tuple[Rollout, Rollout]]) -> tuple[torch.Tensor, dict[str, float]]:
        assert self.dpo is not None
        inputs = bridge.dpo_inputs(
            trainer=self.dpo, pairs=[(c.prompt_ids, c.completion_ids, r.completion_ids) for c, r in pairs],
            action_masks=[(c.action_mask, r.action_mask) for c, r in pairs],
        )
        loss, metrics = bridge.dpo_loss(trainer=self.dpo, model=self.forward_model, inputs=inputs)
        metrics["pairs"] = float(len(pairs))
        return loss, metrics

    def loss(self, batch: TrainBatch) -> tuple[torch.Tensor, dict[str, float]]:
        """The algorithm's objective on `batch`, with the metrics TRL logged computing it."""
        return self.objective.loss(self, batch)

    # -- one update -------------------------------------------------------------------

    def grpo_has_signal(self, rollouts: list[Rollout]) -> bool:
        """Whether the GRPO loss on `rollouts` has a gradient at all. Every TRL loss type
        multiplies each token's term by its advantage, so when every advantage is exactly 0
        (each group's members rewarded alike: all wrong, all right, or all given the same
        fallback) the only term left is the KL penalty, which exists only with beta > 0.
        Undecidable cases (no scored row, no action token) answer True: `grpo_loss` then
        raises NothingToTrain with its own reason."""
        if self.spec.params.beta > 0:
            return True
        rows = scored(rollouts)
        keep = [i for i, r in enumerate(rows) if r.action_count > 0]
        if not keep:
            return True
        advantages = group_advantages(rows, scale=self.spec.params.scale_rewards)[keep]
        return bool((advantages != 0).any())

    def no_signal(self, batch: TrainBatch) -> str | None:
        """Why `batch` cannot move the weights (None: it can, or only the loss can tell).

        AdamW would still move them on such a batch: its momentum replays earlier
        gradients and its weight decay shrinks every weight, so a run fed batches without
        signal (a reward model's fallback scoring every member alike, a rater budget that
        leaves whole groups tied) drifts with nothing to learn. `step` then skips the update.
        Decided on the whole batch, before any learner-group shard, so every rank agrees.
        TRL's own trainers do not skip (they step on whatever the batch gives)."""
        return self.objective.no_signal(self, batch)

    def _batch_metrics(self, batch: TrainBatch) -> dict[str, float]:
        rows = batch.usual + batch.expert
        metrics = {
            "learning_rate": float(self.optimizer.param_groups[0]["lr"]),
            "batch_size": float(len(rows)),
            "expert_count": float(len(batch.expert)),
            # What the model wrote: environment tokens and masked responses count for nothing.
            "response_length": sum(r.action_count for r in rows) / max(1, len(rows)),
            "action_tokens": float(sum(r.action_count for r in rows)),
        }
        rewards = [float(r.reward) for r in rows if r.reward is not None]
        if rewards:
            mean = sum(rewards) / len(rewards)
            metrics["reward_mean"] = mean
            metrics["reward_std"] = math.sqrt(sum((x - mean) ** 2 for x in rewards) / len(rewards))
        return metrics

    def step(self, batch: TrainBatch, *, shard: Shard | None = None) -> dict[str, float]:
        """One optimizer step on `batch`; returns the step's metrics.

        shard: this process's place in a learner group (workers.algorithms.distributed.Shard):
        the loss is this rank's term of the whole batch's objective (its part of the rows,
        weighted by the part's share), and PyTorch's FSDP2 (or DDP) reduces the gradients
        over the group in the backward pass, before the same clipping and update.

        A batch without learning signal (`no_signal`) leaves the weights, the optimizer's
        state and the scheduler exactly as they were, and says so in SKIPPED_NO_SIGNAL."""
        started = time.perf_counter()
        if self.no_signal(batch) is not None:
            return {**self._batch_metrics(batch), SKIPPED_NO_SIGNAL: 1.0, "update_seconds": time.perf_counter() - started}
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        from workers.precision import autocast

        with bridge.TRL_STATE_LOCK, autocast(self.spec.precision, device=self.device):
            loss, metrics = self.loss(batch) if shard is None else shard.loss(self, batch)
        params = self.trainable_parameters
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
            self.scaler.unscale_(self.optimizer)
        else:
            loss.backward()
        if shard is not None:
            loss = shard.reduce(loss)
        grad_norm = torch.nn.utils.clip_grad_norm_(params, self.spec.params.max_grad_norm)
        if hasattr(grad_norm, "full_tensor"):  # sharded gradients: the norm is a DTensor
            grad_norm = grad_norm.full_tensor()
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        seconds = time.perf_counter() - started
        rows = batch.usual + batch.expert
        tokens = sum(len(r.prompt_ids) + len(r.completion_ids) for r in rows)
        metrics.update(self._batch_metrics(batch))
        metrics.update(
            {
                "loss": float(loss.detach()),
                "grad_norm": float(grad_norm),
                "tokens_per_second": tokens / seconds if seconds > 0 else 0.0,
                "update_seconds": seconds,
                SKIPPED_NO_SIGNAL: 0.0,
            }
        )
        return metrics

    # -- state ------------------------------------------------------------------------

    def optimizer_state(self) -> dict[str, object]:
        return {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
        }

    def optimizer_state_load(self, state: dict[str, object]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scheduler is not None and state.get("scheduler") is not None:
            self.scheduler.load_state_dict(state["scheduler"])
