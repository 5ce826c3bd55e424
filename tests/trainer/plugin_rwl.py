"""An algorithm with a loss of its own, as a plugin module: one file, one registration line.

Reward-weighted likelihood (RWL): each completion token's log-likelihood weighted by its
reward minus a baseline, a loss no TRL trainer has. This file is all of it: its settings (a
parameter model, torch-free), its objective (its loss, its no-gradient check and its term on one
rank of a learner gang) and its declaration; the last line registers it when the module is
imported. A deployment names the module in RFT_PLUGINS (every process imports it at start;
a learner gang's followers import what rank 0 loaded); tests/trainer/test_algorithm_plugin.py
loads it so and trains it in one process and on a learner gang of two ranks."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from kernel.algorithms import AlgorithmParams, AlgorithmType, algorithm_register
from workers.algorithms import NothingToTrain, Rollout, TrainBatch
from workers.algorithms.batch import trainable
from workers.algorithms.objectives import Objective, weighted_part

if TYPE_CHECKING:
    import torch

    from workers.algorithms import Learner


class RWLParams(AlgorithmParams):
    # Rewards above it pull a completion's tokens up, rewards below push them down.
    baseline: float = Field(0.5, ge=-1e6, le=1e6)


class RWLObjective(Objective):
    """−Σ (reward − baseline)·log π(token) over the action tokens of the scored usual
    rollouts, divided by their number: a per-token mean, so a rank's part weighs its share
    of the tokens."""

    name = "rwl"

    def __init__(self, learner: Learner) -> None:
        super().__init__(learner)
        settings = learner.spec.settings
        assert isinstance(settings, RWLParams)
        self.baseline = settings.baseline

    def rows(self, batch: TrainBatch) -> list[Rollout]:
        rows = [r for r in trainable(batch.usual) if r.reward is not None]
        if not rows:
            raise NothingToTrain("no scored rollout with a token the model wrote")
        return rows

    def loss_on(self, rows: list[Rollout]) -> tuple[torch.Tensor, dict[str, float]]:
        import torch

        width = max(len(r.prompt_ids) + len(r.completion_ids) for r in rows)
        ids = torch.zeros(len(rows), width, dtype=torch.long)
        attention = torch.zeros(len(rows), width, dtype=torch.long)
        weights = torch.zeros(len(rows), width)
        actions = torch.zeros(len(rows), width)
        for i, r in enumerate(rows):
            start, end = len(r.prompt_ids), len(r.prompt_ids) + len(r.completion_ids)
            ids[i, :end] = torch.tensor(r.prompt_ids + r.completion_ids)
            attention[i, :end] = 1
            actions[i, start:end] = torch.tensor(r.trained_mask, dtype=torch.float32)
            weights[i, start:end] = actions[i, start:end] * (float(r.reward or 0.0) - self.baseline)
        device = next(self.learner.model.parameters()).device
        logits = self.learner.forward_model(input_ids=ids.to(device), attention_mask=attention.to(device)).logits
        logps = torch.log_softmax(logits[:, :-1].float(), dim=-1).gather(-1, ids[:, 1:, None].to(device)).squeeze(-1)
        loss = -(logps * weights[:, 1:].to(device)).sum() / actions.sum()
        return loss, {"weighted_tokens": float(actions.sum())}

    def loss(self, batch: TrainBatch) -> tuple[torch.Tensor, dict[str, float]]:
        return self.loss_on(self.rows(batch))

    def no_gradient(self, batch: TrainBatch) -> str | None:
        rows = [r for r in trainable(batch.usual) if r.reward is not None]
        if rows and all(r.reward == self.baseline for r in rows):
            return "every reward equals the baseline"
        return None

    def shard_loss(self, batch: TrainBatch, *, rank: int, world: int) -> tuple[torch.Tensor, dict[str, float]]:
        return weighted_part(self.loss_on, self.rows(batch), rank=rank, world=world,
                             weight=lambda part: float(sum(r.action_count for r in part)))


class RWL(AlgorithmType):
    name = "rwl"
    summary = "each completion token's log-likelihood weighted by its reward minus a baseline"
    objective = RWLObjective
    params = RWLParams
    learner_gang = True
    form_defaults = {"repeat_times": "4", "trainer.learning_rate": "1e-05", "trainer.params": "baseline: 0.5",
                     "mode": "sync"}


algorithm_register(RWL)  # the one registration line
