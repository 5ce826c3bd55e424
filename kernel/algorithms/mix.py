"""MIX: (1 − mu)·GRPO on the model's own rollouts + mu·SFT on expert ones."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from kernel.algorithms import BatchPlan, algorithm_register
from kernel.algorithms.grpo import GRPO, GRPO_LEGACY_KEYS, GRPOParams

if TYPE_CHECKING:
    from kernel.config import RunConfig


class MIXParams(GRPOParams):
    """MIX's settings: its GRPO side's, and how it mixes in SFT."""

    # (1 - mu) * GRPO(usual) + mu * SFT(expert); expert_share of each batch is expert.
    mu: float = Field(0.1, ge=0.0, le=1.0)
    expert_share: float = Field(0.25, ge=0.0, le=1.0)


@algorithm_register
class MIX(GRPO):
    name = "mix"
    objective = "workers.algorithms.objectives.mix:MIX"
    summary = "GRPO on the model's own rollouts plus SFT on expert ones (trainer.params.mu)"
    params = MIXParams
    legacy_keys = {**GRPO_LEGACY_KEYS, "mu": "mu", "expert_share": "expert_share"}
    form_defaults = {"repeat_times": "8", "trainer.learning_rate": "1e-05", "trainer.params": "mu: 0.1", "mode": "sync"}

    def batch_plan(self, cfg: RunConfig) -> BatchPlan:
        params = cfg.trainer.params
        assert isinstance(params, MIXParams)
        size = cfg.train_batch_size
        expert = min(size - 1, round(params.expert_share * size)) if size > 1 else 0
        return BatchPlan(usual=size - expert, expert=expert, whole_groups=True)

    def batch_ready(self, plan: BatchPlan, *, usual: int, expert: int) -> tuple[bool, bool]:
        # The expert part is optional (a missing side adds nothing); the usual part sets the pace.
        return usual >= plan.usual, usual > 0 or expert > 0

