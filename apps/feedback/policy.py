"""The run's feedback policy: how automatic and human rewards become the final reward.

`auto`: the reward functions decide; an experience is ready when written.
`blend` / `human`: an experience waits (status pending) for human feedback, which the
policy folds in; a wait window in wall time ends with the policy's fallback.
"""

from __future__ import annotations

from typing import Any

from apps.runs.config import RunConfig


def experience_initial_fields(*, cfg: RunConfig, auto_reward: float | None) -> dict[str, Any]:
    """Status and reward fields for a freshly explored experience under the run's policy."""
    if cfg.feedback.mode == "auto":
        return {"status": "ready", "auto_reward": auto_reward, "reward": auto_reward}
    return {"status": "pending", "auto_reward": auto_reward, "reward": None}
