"""DPO: TRL's DPO loss on the preference pairs among the batch's rollouts."""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

import torch

from kernel.algorithms.dpo import DPOParams
from workers.algorithms import trl_bridge as bridge
from workers.algorithms.batch import Rollout, TrainBatch, preference_pairs
from workers.algorithms.trainee import NothingToTrain, Trainee
from workers.algorithms.objectives import Objective, weighted_part

if TYPE_CHECKING:
    from datasets import Dataset
    from transformers import PreTrainedTokenizerBase
    from trl import DPOTrainer


Pair = tuple[Rollout, Rollout]


@bridge.holding_trl_state
def trainer_build(
    *, model: torch.nn.Module, ref_model: torch.nn.Module | None, tokenizer: PreTrainedTokenizerBase,
    params: bridge.TrainParams, settings: DPOParams, train_dataset: Dataset | None = None, batch_size: int = 2
) -> DPOTrainer:
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    bridge.trl_check()
    args = DPOConfig(
        **bridge.common_args(params),
        per_device_train_batch_size=batch_size,
        beta=settings.beta,
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


def inputs_build(
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
        return bridge.on_model(trainer, inputs)
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
    return bridge.on_model(trainer, inputs)


def trl_loss(*, trainer: DPOTrainer, model: torch.nn.Module, inputs: dict[str, torch.Tensor]
             ) -> tuple[torch.Tensor, dict[str, float]]:
    loss = trainer.compute_loss(model, inputs)
    m = bridge.metrics_drain(trainer)
    metrics = {
        "reward_accuracy": m.get("rewards/accuracies"),
        "reward_margin": m.get("rewards/margins"),
        "entropy": m.get("entropy"),
    }
    return loss, {k: v for k, v in metrics.items() if v is not None}


class DPO(Objective):
    name = "dpo"

    def __init__(self, learner: Trainee) -> None:
        super().__init__(learner)
        settings = learner.spec.settings
        assert isinstance(settings, DPOParams)
        self.dpo = trainer_build(model=learner.model, ref_model=learner.ref_model, tokenizer=learner.tokenizer,
                                 params=learner.spec.params, settings=settings)

    @property
    def trainer(self) -> DPOTrainer:
        return self.dpo

    def pairs(self, rollouts: list[Rollout], preferences: list[tuple[int, int]]) -> list[Pair]:
        pairs = preference_pairs(rollouts, preferences=preferences)
        # A pair neither of whose completions has a token the model sampled scores nothing.
        pairs = [(c, r) for c, r in pairs if c.action_count or r.action_count]
        if not pairs:
            raise NothingToTrain("no preference pair (every group tied, no pairwise feedback, or every action mask zero)")
        return pairs

    def loss_on(self, pairs: list[Pair]) -> tuple[torch.Tensor, dict[str, float]]:
        inputs = inputs_build(
            trainer=self.dpo, pairs=[(c.prompt_ids, c.completion_ids, r.completion_ids) for c, r in pairs],
            action_masks=[(c.action_mask, r.action_mask) for c, r in pairs],
        )
        loss, metrics = trl_loss(trainer=self.dpo, model=self.learner.forward_model, inputs=inputs)
        metrics["pairs"] = float(len(pairs))
        return loss, metrics

    def loss(self, batch: TrainBatch) -> tuple[torch.Tensor, dict[str, float]]:
        # A pair to learn always carries a gradient: no `no_gradient` check.
        return self.loss_on(self.pairs(batch.usual + batch.expert, batch.preferences))

    def shard_loss(self, batch: TrainBatch, *, rank: int, world: int) -> tuple[torch.Tensor, dict[str, float]]:
        # TRL's sigmoid DPO loss is a mean over the pairs.
        pairs = self.pairs(batch.usual + batch.expert, batch.preferences)
        return weighted_part(self.loss_on, pairs, rank=rank, world=world, weight=lambda part: float(len(part)))
