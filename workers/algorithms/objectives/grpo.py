"""GRPO: TRL's GRPO loss (every loss type) on group-relative advantages of the usual rollouts."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kernel.algorithms import GROUP_PER_SEQUENCE
from workers.algorithms.batch import Rollout, TrainBatch, trainable
from workers.algorithms.objectives import Objective, objective_register, weighted_part

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

    def shard_loss(self, learner: Learner, batch: TrainBatch, *, rank: int, world: int) -> tuple[torch.Tensor, dict[str, float]]:
        rows, advantages = learner.grpo_plan(batch.usual)  # the whole batch's advantages
        index = {id(r): i for i, r in enumerate(rows)}
        per_sequence = learner.spec.params.loss_type in GROUP_PER_SEQUENCE

        def loss_on(part: list[Rollout]) -> tuple[torch.Tensor, dict[str, float]]:
            return learner.grpo_loss_on(part, advantages[[index[id(r)] for r in part]])

        def weight(part: list[Rollout]) -> float:
            return float(len(part)) if per_sequence else float(sum(r.action_count for r in part))

        return weighted_part(loss_on, rows, rank=rank, world=world, weight=weight)
