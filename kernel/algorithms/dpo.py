"""DPO: preference pairs drawn within a group, against a frozen reference model."""

from __future__ import annotations

from kernel.algorithms import AlgorithmType, algorithm_register


@algorithm_register
class DPO(AlgorithmType):
    name = "dpo"
    summary = "direct preference optimisation on pairs ranked within a group"
    learner_group = True
    preference_pairs = True
    reference_always = True
    form_defaults = {"repeat_times": "2", "trainer.learning_rate": "5e-07", "trainer.dpo_beta": "0.1", "mode": "sync"}
