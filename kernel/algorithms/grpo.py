"""GRPO: the policy gradient on group-relative advantages (TRL's GRPO loss and its variants)."""

from __future__ import annotations

from kernel.algorithms import AlgorithmType, algorithm_register


@algorithm_register
class GRPO(AlgorithmType):
    name = "grpo"
    summary = "policy gradient on rewards relative to the other completions of the same task"
    group_relative = True
    reference_for_kl = True
    learner_group = True
    form_defaults = {"repeat_times": "8", "trainer.learning_rate": "1e-05", "trainer.loss_type": "dapo", "mode": "sync"}
