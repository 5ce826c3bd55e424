"""GRPO: TRL's GRPO loss (every loss type) on group-relative advantages of the usual rollouts."""

from __future__ import annotations

from typing import TYPE_CHECKING

from apps.runs.algorithms import GROUP_PER_SEQUENCE
from workers.algorithms.batch import Rollout, TrainBatch, trainable
from workers.algorithms.objectives import Objective, objective_register

if TYPE_CHECKING:
    import torch

    from workers.algorithms.learner import Learner


@objective_register
class GRPO(Objective):
    name = "grpo"
    trainers = ("grpo",)

    def loss(self, learner: Learner, batch: TrainBatch) -> tuple[torch.Tensor, dict[str, float]]:
        return learner.grpo_loss(batch.usual)

    def no_signal(self, learner: Learner, batch: TrainBatch) -> str | None:
        usual = trainable(batch.usual)
        if usual and not learner.grpo_has_signal(batch.usual):
            return "every advantage is zero (each group's rewards are equal) and beta is 0"
        return None

    def group_rows(self, batch: TrainBatch) -> tuple[list[Rollout], bool]:
        return trainable(batch.usual), True  # advantages need a whole group on one rank

    def group_part(self, rows: list[Rollout]) -> TrainBatch:
        return TrainBatch(usual=rows)

    def group_share(self, learner: Learner, rows: list[Rollout], mine: list[Rollout]) -> float:
        if learner.spec.params.loss_type in GROUP_PER_SEQUENCE:
            return len(mine) / len(rows)
        return super().group_share(learner, rows, mine)
