"""DPO: TRL's DPO loss on the preference pairs among the batch's rollouts."""

from __future__ import annotations

from typing import TYPE_CHECKING

from workers.algorithms.batch import TrainBatch
from workers.algorithms.objectives import Objective, objective_register, weighted_part

if TYPE_CHECKING:
    import torch

    from workers.algorithms.learner import Learner


@objective_register
class DPO(Objective):
    name = "dpo"
    trainers = ("dpo",)

    def loss(self, learner: Learner, batch: TrainBatch) -> tuple[torch.Tensor, dict[str, float]]:
        # A pair to learn always carries a gradient: no `no_signal` check.
        return learner.dpo_loss(batch.usual + batch.expert, batch.preferences)

    def shard_loss(self, learner: Learner, batch: TrainBatch, *, rank: int, world: int) -> tuple[torch.Tensor, dict[str, float]]:
        # TRL's sigmoid DPO loss is a mean over the pairs.
        pairs = learner.dpo_pairs(batch.usual + batch.expert, batch.preferences)
        return weighted_part(learner.dpo_loss_on, pairs, rank=rank, world=world, weight=lambda part: float(len(part)))
