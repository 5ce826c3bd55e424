"""SFT: TRL's SFT loss on expert rollouts (and whatever else an offline batch holds)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from workers.algorithms.batch import TrainBatch
from workers.algorithms.objectives import Objective, objective_register, weighted_part

if TYPE_CHECKING:
    import torch

    from workers.algorithms.learner import Learner


@objective_register
class SFT(Objective):
    name = "sft"
    trainers = ("sft",)

    def loss(self, learner: Learner, batch: TrainBatch) -> tuple[torch.Tensor, dict[str, float]]:
        # Offline SFT trains on whatever it is given; expert rows are what the trainer claims.
        return learner.sft_loss(batch.expert + batch.usual)

    def shard_loss(self, learner: Learner, batch: TrainBatch, *, rank: int, world: int) -> tuple[torch.Tensor, dict[str, float]]:
        # TRL's SFT loss is a mean over the completion tokens it learns (labels not -100).
        return weighted_part(learner.sft_loss_on, learner.sft_rows(batch.expert + batch.usual), rank=rank, world=world,
                             weight=lambda part: float(sum(r.action_count for r in part)))
