"""DPO: preference pairs drawn within a group, against a frozen reference model."""

from __future__ import annotations

from pydantic import Field

from kernel.algorithms import AlgorithmParams, AlgorithmType, algorithm_register


class DPOParams(AlgorithmParams):
    """DPO's settings (before `trainer.params`, `beta` was `trainer.dpo_beta`)."""

    # The temperature of DPO's log-ratio (TRL's DPOConfig.beta): how far from the reference
    # the policy may move to fit the preferences.
    beta: float = Field(0.1, gt=0.0)


@algorithm_register
class DPO(AlgorithmType):
    name = "dpo"
    objective = "workers.algorithms.objectives.dpo:DPO"
    summary = "direct preference optimisation on pairs ranked within a group"
    learner_gang = True
    preference_pairs = True
    params = DPOParams
    legacy_keys = {"dpo_beta": "beta"}
    form_defaults = {"repeat_times": "2", "trainer.learning_rate": "5e-07", "trainer.params": "beta: 0.1", "mode": "sync"}

    def needs_reference(self, params: AlgorithmParams) -> bool:
        return True  # the log-ratio of policy to reference is the loss
