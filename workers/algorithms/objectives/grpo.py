"""GRPO: TRL's GRPO loss (every loss type) on group-relative advantages of the usual rollouts.

Its TRL trainer, the inputs dict TRL's own pipeline would have built from our stored
rollouts, the KL reference's logprobs, the loss with its metrics, the no-gradient check and
a learner gang's term of the loss: all here (TRL's internals each leans on are pinned by
tests/trainer/test_trl_bridge.py)."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import torch

from kernel.algorithms import PER_SEQUENCE_LOSS_TYPES
from kernel.algorithms.grpo import GRPOParams
from workers.algorithms import trl_bridge as bridge
from workers.algorithms.batch import Rollout, TrainBatch, group_advantages, scored, trainable
from workers.algorithms.trainee import NothingToTrain, Trainee
from workers.algorithms.objectives import Objective, weighted_part

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase
    from trl import GRPOTrainer



@bridge.holding_trl_state
def trainer_build(
    *, model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, params: bridge.TrainParams, settings: GRPOParams,
    num_generations: int = 2,
    batch_size: int = 2, rollout_func: Callable[..., Mapping[str, object]] | None = None,
    reward_funcs: Sequence[Callable[..., list[float]]] | None = None,
) -> GRPOTrainer:
    """A GRPOTrainer around `model` that we only ask for losses. `num_generations` and
    `batch_size` matter only to TRL's own generation path (used by tests as the oracle)."""
    from trl import GRPOConfig, GRPOTrainer

    bridge.trl_check()
    args = GRPOConfig(
        **bridge.common_args(params),
        per_device_train_batch_size=batch_size,
        num_generations=num_generations,
        max_completion_length=params.max_completion_length,
        loss_type=settings.loss_type,
        beta=settings.beta,
        epsilon=settings.epsilon,
        epsilon_high=settings.epsilon_high,
        scale_rewards=settings.scale_rewards,
        importance_sampling_level="sequence" if settings.loss_type == "luspo" else "token",
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
            train_dataset=bridge.dummy_prompt_dataset(max(batch_size, num_generations)),
            processing_class=tokenizer,
            rollout_func=rollout_func,
        )
    # We step once per batch, never accumulate: TRL divides the loss by this.
    trainer.current_gradient_accumulation_steps = 1
    return trainer


def inputs_build(
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
    pad, pad_id = bridge.pad, trainer.processing_class.pad_token_id
    completion_mask = pad([[1] * len(c) for c in completion_ids], value=0, side="right", dtype=torch.long)
    inputs: dict[str, torch.Tensor] = {
        "prompt_ids": pad(prompt_ids, value=pad_id, side="left", dtype=torch.long),
        "prompt_mask": pad([[1] * len(p) for p in prompt_ids], value=0, side="left", dtype=torch.long),
        "completion_ids": pad(completion_ids, value=pad_id, side="right", dtype=torch.long),
        "completion_mask": completion_mask,
        "advantages": advantages.to(torch.float32),
        "num_items_in_batch": completion_mask.sum(),
    }
    if action_masks is not None:
        for mask, completion in zip(action_masks, completion_ids, strict=True):
            if len(mask) != len(completion):
                raise ValueError(f"an action mask has {len(mask)} entries for {len(completion)} completion tokens")
        tool_mask = pad(action_masks, value=0, side="right", dtype=torch.long)
        inputs["tool_mask"] = tool_mask
        inputs["num_items_in_batch"] = (completion_mask * tool_mask).sum()
    if old_logprobs is not None:
        old = pad(old_logprobs, value=0.0, side="right", dtype=torch.float32)
        if action_masks is not None:
            old = old.masked_fill(inputs["tool_mask"] == 0, 0.0)
        inputs["old_per_token_logps"] = old
    return bridge.on_model(trainer, inputs)


def ref_logps(*, trainer: GRPOTrainer, ref_model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """Per-token logprobs of the completions under the reference model, as TRL computes them.
    `ref_model` may be the trainer's own (peft) model under `disable_adapter()`: TRL has
    patched its base already."""
    with torch.no_grad():  # a reference forward: no graph
        if ref_model is not trainer.model:
            bridge.fused_head(ref_model, temperature=trainer.temperature)
        input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
        attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        pixels = {k: inputs[k] for k in ("pixel_values", "pixel_attention_mask", "image_grid_thw", "image_sizes", "num_images")
                  if k in inputs}
        logps, _, _ = trainer._get_per_token_logps_and_entropies(
            ref_model, input_ids, attention_mask, inputs["completion_ids"].size(1), **pixels
        )
        return logps


def trl_loss(*, trainer: GRPOTrainer, model: torch.nn.Module, inputs: dict[str, torch.Tensor]
             ) -> tuple[torch.Tensor, dict[str, float]]:
    """TRL's loss on `inputs`, with the metrics it logged computing it."""
    loss = trainer.compute_loss(model, inputs)
    m = bridge.metrics_drain(trainer)
    metrics = {"entropy": m.get("entropy"), "kl": m.get("kl")}
    if "clip_ratio/region_mean" in m:
        metrics["clip_fraction"] = m["clip_ratio/region_mean"]
    elif "cispo_clip_ratio" in m:
        metrics["clip_fraction"] = m["cispo_clip_ratio"]
    return loss, {k: v for k, v in metrics.items() if v is not None}


class GRPO(Objective):
    name = "grpo"

    def __init__(self, learner: Trainee) -> None:
        super().__init__(learner)
        # GRPO's settings, or MIX's (its GRPO side's and its own).
        settings = learner.spec.settings
        assert isinstance(settings, GRPOParams)
        self.settings = settings
        self.grpo = trainer_build(model=learner.model, tokenizer=learner.tokenizer, params=learner.spec.params,
                                  settings=settings)

    @property
    def trainer(self) -> GRPOTrainer:
        return self.grpo

    def plan(self, rollouts: list[Rollout]) -> tuple[list[Rollout], torch.Tensor]:
        """(the rows the loss trains on, their advantages): advantages over every scored
        row of the whole batch (a masked one's reward still sets its group's baseline); the
        loss sees only rows with at least one action token. A learner gang takes the plan of
        the whole batch on every rank and deals its rows, so the advantages never change."""
        rows = scored(rollouts)
        if not rows:
            raise NothingToTrain("no rollout with a response")
        all_advantages = group_advantages(rows, scale=self.settings.scale_rewards)
        keep = [i for i, r in enumerate(rows) if r.action_count > 0]
        if not keep:
            raise NothingToTrain("no rollout with a token the model sampled (every action mask is zero)")
        return [rows[i] for i in keep], all_advantages[keep]

    def rollouts_loss(self, rollouts: list[Rollout]) -> tuple[torch.Tensor, dict[str, float]]:
        """The loss on these rollouts (a MIX learner's GRPO side takes its usual ones)."""
        return self.loss_on(*self.plan(rollouts))

    def loss(self, batch: TrainBatch) -> tuple[torch.Tensor, dict[str, float]]:
        return self.rollouts_loss(batch.usual)

    def loss_on(self, rollouts: list[Rollout], advantages: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        """TRL's GRPO loss on `rollouts` (each with an action token) with these advantages."""
        learner = self.learner
        have_logprobs = all(r.logprobs is not None and len(r.logprobs) == len(r.completion_ids) for r in rollouts)
        masked = any(r.action_mask is not None for r in rollouts)
        inputs = inputs_build(
            trainer=self.grpo,
            prompt_ids=[r.prompt_ids for r in rollouts],
            completion_ids=[r.completion_ids for r in rollouts],
            # Without stored logprobs, TRL's ratio is against the current policy (on-policy).
            old_logprobs=[list(r.logprobs or []) for r in rollouts] if have_logprobs else None,
            advantages=advantages,
            action_masks=[r.trained_mask for r in rollouts] if masked else None,
        )
        inputs.update(learner.pixel_inputs(rollouts))
        if self.settings.beta > 0:
            inputs["ref_per_token_logps"] = self.reference_logps(inputs)
        loss, metrics = trl_loss(trainer=self.grpo, model=learner.forward_model, inputs=inputs)
        metrics["advantage_abs_mean"] = float(advantages.abs().mean())
        return loss, metrics

    def reference_logps(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """Per-token logprobs of the completions under the KL reference: the reference
        model, or with an adapter the same model with the adapter switched off."""
        with self.learner.reference() as ref_model:
            return ref_logps(trainer=self.grpo, ref_model=ref_model, inputs=inputs)

    def has_gradient(self, rollouts: list[Rollout]) -> bool:
        """Whether the loss on `rollouts` has a gradient at all. Every TRL loss type
        multiplies each token's term by its advantage, so when every advantage is exactly 0
        (each group's members rewarded alike: all wrong, all right, or all given the same
        fallback) the only term left is the KL penalty, which exists only with beta > 0.
        Undecidable cases (no scored row, no action token) answer True: the loss then
        raises NothingToTrain with its own reason."""
        if self.settings.beta > 0:
            return True
        rows = scored(rollouts)
        keep = [i for i, r in enumerate(rows) if r.action_count > 0]
        if not keep:
            return True
        advantages = group_advantages(rows, scale=self.settings.scale_rewards)[keep]
        return bool((advantages != 0).any())

    def no_gradient(self, batch: TrainBatch) -> str | None:
        if trainable(batch.usual) and not self.has_gradient(batch.usual):
            return "every advantage is zero (each group's rewards are equal) and beta is 0"
        return None

    def shard_loss(self, batch: TrainBatch, *, rank: int, world: int) -> tuple[torch.Tensor, dict[str, float]]:
        rows, advantages = self.plan(batch.usual)  # the whole batch's advantages
        index = {id(r): i for i, r in enumerate(rows)}
        per_sequence = self.settings.loss_type in PER_SEQUENCE_LOSS_TYPES

        def loss_on(part: list[Rollout]) -> tuple[torch.Tensor, dict[str, float]]:
            return self.loss_on(part, advantages[[index[id(r)] for r in part]])

        def weight(part: list[Rollout]) -> float:
            return float(len(part)) if per_sequence else float(sum(r.action_count for r in part))

        return weighted_part(loss_on, rows, rank=rank, world=world, weight=weight)
