"""MIX: (1 − mu)·GRPO on the usual rollouts + mu·SFT on the expert ones (each side the
GRPO and SFT objectives themselves, built on the same learner)."""

from __future__ import annotations

from collections.abc import Callable

from typing import TYPE_CHECKING

import torch

from kernel.algorithms.mix import MIXParams
from workers.algorithms.batch import TrainBatch, trainable
from workers.algorithms.trainee import NothingToTrain, Trainee
from workers.algorithms.objectives import Objective
from workers.algorithms.objectives.grpo import GRPO
from workers.algorithms.objectives.sft import SFT

if TYPE_CHECKING:
    from trl import GRPOTrainer

Term = Callable[[TrainBatch], tuple[torch.Tensor, dict[str, float]]]


class MIX(Objective):
    name = "mix"

    def __init__(self, learner: Trainee) -> None:
        super().__init__(learner)
        settings = learner.spec.settings
        assert isinstance(settings, MIXParams)
        self.mu = settings.mu
        self.grpo = GRPO(learner)
        self.sft = SFT(learner)

    @property
    def trainer(self) -> GRPOTrainer:
        return self.grpo.trainer

    def loss(self, batch: TrainBatch) -> tuple[torch.Tensor, dict[str, float]]:
        return self._mixed(batch, grpo=self.grpo.loss, sft=lambda b: self.sft.rollouts_loss(b.expert))

    def shard_loss(self, batch: TrainBatch, *, rank: int, world: int) -> tuple[torch.Tensor, dict[str, float]]:
        # Each side is its own objective's term on this rank; the sides are decided on the
        # whole batch, so every rank runs the same ones.
        return self._mixed(batch, grpo=lambda b: self.grpo.shard_loss(b, rank=rank, world=world),
                           sft=lambda b: self.sft.shard_loss(b, rank=rank, world=world))

    def _mixed(self, batch: TrainBatch, *, grpo: Term, sft: Term) -> tuple[torch.Tensor, dict[str, float]]:
        mu = self.mu
        parts: list[torch.Tensor] = []
        metrics: dict[str, float] = {}
        # A term with zero weight is skipped, not multiplied by zero: mu = 0 is GRPO and mu = 1
        # is SFT exactly, and a side with no data adds nothing.
        if mu < 1 and trainable(batch.usual):
            g, gm = grpo(TrainBatch(usual=batch.usual))
            parts.append((1 - mu) * g)
            metrics.update({f"grpo_{k}" if k != "clip_fraction" else k: v for k, v in gm.items()})
            metrics["grpo_loss"] = float(g.detach())
        if mu > 0 and trainable(batch.expert):
            s, sm = sft(TrainBatch(expert=batch.expert))
            parts.append(mu * s)
            metrics["sft_loss"] = float(s.detach())
            metrics.update({f"sft_{k}": v for k, v in sm.items()})
        if not parts:
            raise NothingToTrain("mix batch has neither usual nor expert rollouts to learn from")
        if "grpo_entropy" in metrics:
            metrics["entropy"] = metrics["grpo_entropy"]
        if "grpo_kl" in metrics:
            metrics["kl"] = metrics["grpo_kl"]
        return torch.stack(parts).sum() if len(parts) > 1 else parts[0], metrics

    def no_gradient(self, batch: TrainBatch) -> str | None:
        mu = self.mu
        grpo_part = mu < 1 and bool(trainable(batch.usual))
        sft_part = mu > 0 and bool(trainable(batch.expert))
        if grpo_part and not sft_part and not self.grpo.has_gradient(batch.usual):
            return "no expert rollout, and every advantage of the usual ones is zero with beta 0"
        return None
