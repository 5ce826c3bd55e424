"""SFT: TRL's SFT loss on expert rollouts (and whatever else an offline batch holds)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from workers.algorithms.batch import Rollout, TrainBatch, trainable
from workers.algorithms.objectives import Objective, objective_register

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

    def group_rows(self, batch: TrainBatch) -> tuple[list[Rollout], bool]:
        return trainable(batch.expert + batch.usual), False

    def group_part(self, rows: list[Rollout]) -> TrainBatch:
        return TrainBatch(expert=rows)
