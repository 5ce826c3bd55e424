"""MIX: (1 − mu)·GRPO on the model's own rollouts + mu·SFT on expert ones."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kernel.algorithms import AlgorithmType, BatchPlan, algorithm_register

if TYPE_CHECKING:
    from kernel.config import RunConfig


@algorithm_register
class MIX(AlgorithmType):
    name = "mix"
    summary = "GRPO on the model's own rollouts plus SFT on expert ones (trainer.mu)"
    learner_group = True
    group_relative = True
    reference_for_kl = True
    form_defaults = {"repeat_times": "8", "trainer.learning_rate": "1e-05", "trainer.mu": "0.1", "mode": "sync"}

    def batch_plan(self, cfg: RunConfig) -> BatchPlan:
        size = cfg.train_batch_size
        expert = min(size - 1, round(cfg.trainer.expert_share * size)) if size > 1 else 0
        return BatchPlan(usual=size - expert, expert=expert, whole_groups=True)

    def batch_ready(self, plan: BatchPlan, *, usual: int, expert: int) -> tuple[bool, bool]:
        # The expert part is optional (a missing side adds nothing); the usual part sets the pace.
        return usual >= plan.usual, usual > 0 or expert > 0
