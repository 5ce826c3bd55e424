"""SFT: TRL's SFT loss on expert rollouts (and whatever else an offline batch holds)."""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

import torch

from workers.algorithms import trl_bridge as bridge
from workers.algorithms.batch import Rollout, TrainBatch, trainable
from workers.algorithms.trainee import NothingToTrain, Trainee
from workers.algorithms.objectives import Objective, weighted_part

if TYPE_CHECKING:
    from datasets import Dataset
    from transformers import PreTrainedTokenizerBase
    from trl import SFTTrainer



@bridge.holding_trl_state
def trainer_build(
    *, model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, params: bridge.TrainParams,
    train_dataset: Dataset | None = None, batch_size: int = 2
) -> SFTTrainer:
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    bridge.trl_check()
    args = SFTConfig(
        **bridge.common_args(params),
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


def inputs_build(
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
    return bridge.on_model(trainer, trainer.data_collator(examples))


def trl_loss(*, trainer: SFTTrainer, model: torch.nn.Module, inputs: dict[str, torch.Tensor]
             ) -> tuple[torch.Tensor, dict[str, float]]:
    loss = trainer.compute_loss(model, dict(inputs), num_items_in_batch=None)
    m = bridge.metrics_drain(trainer)
    metrics = {"entropy": m.get("entropy"), "token_accuracy": m.get("mean_token_accuracy")}
    return loss, {k: v for k, v in metrics.items() if v is not None}


class SFT(Objective):
    name = "sft"

    def __init__(self, learner: Trainee) -> None:
        super().__init__(learner)
        self.sft = trainer_build(model=learner.model, tokenizer=learner.tokenizer, params=learner.spec.params)

    @property
    def trainer(self) -> SFTTrainer:
        return self.sft

    def rows(self, rollouts: list[Rollout]) -> list[Rollout]:
        rows = trainable(rollouts)
        if not rows:
            raise NothingToTrain("no expert rollout with a token to learn (empty, or every action mask zero)")
        return rows

    def rollouts_loss(self, rollouts: list[Rollout]) -> tuple[torch.Tensor, dict[str, float]]:
        """The loss on these rollouts' trainable rows (a MIX learner's SFT side, RAFT's selection)."""
        return self.loss_on(self.rows(rollouts))

    def loss_on(self, rollouts: list[Rollout]) -> tuple[torch.Tensor, dict[str, float]]:
        inputs = inputs_build(
            trainer=self.sft,
            rows=[(r.prompt_ids, r.completion_ids) for r in rollouts],
            action_masks=[r.action_mask for r in rollouts],
        )
        return trl_loss(trainer=self.sft, model=self.learner.forward_model, inputs=inputs)

    def loss(self, batch: TrainBatch) -> tuple[torch.Tensor, dict[str, float]]:
        # Offline SFT trains on whatever it is given; expert rows are what the trainer claims.
        return self.rollouts_loss(batch.expert + batch.usual)

    def shard_loss(self, batch: TrainBatch, *, rank: int, world: int) -> tuple[torch.Tensor, dict[str, float]]:
        # TRL's SFT loss is a mean over the completion tokens it learns (labels not -100).
        return weighted_part(self.loss_on, self.rows(batch.expert + batch.usual), rank=rank, world=world,
                             weight=lambda part: float(sum(r.action_count for r in part)))
