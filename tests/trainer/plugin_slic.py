"""An algorithm that trains on preference pairs, as a plugin module: one file, one registration line.

SLiC's calibration loss (sequence likelihood calibration): for each (chosen, rejected) pair, a
hinge max(0, delta − log π(chosen) + log π(rejected)) on the completions' log-likelihoods (their
action tokens), no reference model. Its declaration says `preference_pairs = True`: the
trainer's batches then carry the pairs people stated among their rollouts (whatever feedback
kind stated them), as DPO's do; its objective pairs them as DPO's does (each stated pair, and
a group no pair covers by its best and worst reward). tests/trainer/test_preference_plugins.py
loads it with a preference-stating feedback kind (plugin_best_of.py) and trains a step."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from kernel.algorithms import AlgorithmParams, AlgorithmType, algorithm_register
from workers.algorithms import NothingToTrain, Rollout, TrainBatch, preference_pairs
from workers.algorithms.objectives import Objective

if TYPE_CHECKING:
    import torch

    from workers.algorithms import Learner


class SLiCParams(AlgorithmParams):
    # How far the chosen completion's log-likelihood must stand above the rejected one's.
    delta: float = Field(1.0, gt=0.0, le=1e6)


class SLiCObjective(Objective):
    name = "slic"

    def __init__(self, learner: Learner) -> None:
        super().__init__(learner)
        settings = learner.spec.settings
        assert isinstance(settings, SLiCParams)
        self.delta = settings.delta

    def pairs(self, batch: TrainBatch) -> list[tuple[Rollout, Rollout]]:
        pairs = [(c, r) for c, r in preference_pairs(batch.usual, preferences=batch.preferences)
                 if c.action_count and r.action_count]
        if not pairs:
            raise NothingToTrain("no preference pair")
        return pairs

    def _logp(self, rows: list[Rollout]) -> torch.Tensor:
        """Each row's log-likelihood of its action tokens under the policy."""
        import torch

        width = max(len(r.prompt_ids) + len(r.completion_ids) for r in rows)
        ids = torch.zeros(len(rows), width, dtype=torch.long)
        attention = torch.zeros(len(rows), width, dtype=torch.long)
        actions = torch.zeros(len(rows), width)
        for i, r in enumerate(rows):
            start, end = len(r.prompt_ids), len(r.prompt_ids) + len(r.completion_ids)
            ids[i, :end] = torch.tensor(r.prompt_ids + r.completion_ids)
            attention[i, :end] = 1
            actions[i, start:end] = torch.tensor(r.trained_mask, dtype=torch.float32)
        device = next(self.learner.model.parameters()).device
        logits = self.learner.forward_model(input_ids=ids.to(device), attention_mask=attention.to(device)).logits
        logps = torch.log_softmax(logits[:, :-1].float(), dim=-1).gather(-1, ids[:, 1:, None].to(device)).squeeze(-1)
        return (logps * actions[:, 1:].to(device)).sum(-1)

    def loss(self, batch: TrainBatch) -> tuple[torch.Tensor, dict[str, float]]:
        pairs = self.pairs(batch)
        chosen = self._logp([c for c, _ in pairs])
        rejected = self._logp([r for _, r in pairs])
        loss = (self.delta - chosen + rejected).clamp_min(0.0).mean()
        return loss, {"pairs": float(len(pairs))}


class SLiC(AlgorithmType):
    name = "slic"
    summary = "a hinge on the log-likelihoods of the pairs people stated (and each group's best over its worst)"
    objective = SLiCObjective
    params = SLiCParams
    preference_pairs = True
    form_defaults = {"repeat_times": "2", "trainer.learning_rate": "1e-05", "trainer.params": "delta: 1.0",
                     "mode": "sync"}


algorithm_register(SLiC)  # the one registration line
