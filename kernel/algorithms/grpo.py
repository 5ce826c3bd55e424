"""GRPO: the policy gradient on group-relative advantages (TRL's GRPO loss and its variants)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from kernel.algorithms import AlgorithmParams, AlgorithmType, algorithm_register

# The old flat `trainer.<key>` settings that were GRPO's (and are MIX's GRPO side).
GRPO_LEGACY_KEYS = {key: key for key in ("loss_type", "beta", "epsilon", "epsilon_high", "scale_rewards")}


class GRPOParams(AlgorithmParams):
    """GRPO's settings: TRL's GRPOConfig fields of the same names."""

    # TRL's GRPO loss types (its GRPOConfig.loss_type).
    loss_type: Literal["grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo", "vespo"] = "dapo"
    # The KL penalty's weight against the reference model (0: none, and no reference model).
    beta: float = Field(0.0, ge=0.0)
    # The clipping range of the importance ratio (epsilon_high: its upper side, DAPO's clip-higher).
    epsilon: float = Field(0.2, gt=0.0)
    epsilon_high: float | None = Field(None, gt=0.0)
    # Advantages scaled by the standard deviation of the group's rewards, the batch's, or not.
    scale_rewards: Literal["group", "batch", "none"] = "group"


@algorithm_register
class GRPO(AlgorithmType):
    name = "grpo"
    objective = "workers.algorithms.objectives.grpo:GRPO"
    summary = "policy gradient on rewards relative to the other completions of the same task"
    group_relative = True
    learner_gang = True
    params = GRPOParams
    legacy_keys = GRPO_LEGACY_KEYS
    form_defaults = {"repeat_times": "8", "trainer.learning_rate": "1e-05", "trainer.params": "loss_type: dapo",
                     "mode": "sync"}

    def needs_reference(self, params: AlgorithmParams) -> bool:
        assert isinstance(params, GRPOParams)
        return params.beta > 0
