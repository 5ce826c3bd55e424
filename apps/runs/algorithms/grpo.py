"""GRPO: the policy gradient on group-relative advantages (TRL's GRPO loss and its variants)."""

from __future__ import annotations

from apps.runs.algorithms import GROUP_PER_SEQUENCE, GROUP_PER_TOKEN, AlgorithmType, algorithm_register


@algorithm_register
class GRPO(AlgorithmType):
    name = "grpo"
    summary = "policy gradient on rewards relative to the other completions of the same task"
    group_relative = True
    reference_for_kl = True
    learner_group = True
    form_defaults = {"repeat_times": "8", "trainer.learning_rate": "1e-05", "trainer.loss_type": "dapo", "mode": "sync"}

    def group_refusal(self, *, loss_type: str, scale_rewards: str) -> str | None:
        exact = GROUP_PER_SEQUENCE + GROUP_PER_TOKEN
        if loss_type not in exact:
            return (f"loss_type {loss_type} does not split exactly over a learner group; "
                    f"use one of {', '.join(exact)} or processes: 1")
        if scale_rewards == "batch":
            return "scale_rewards=batch needs the whole batch's statistics on every process; use group or none"
        return None
