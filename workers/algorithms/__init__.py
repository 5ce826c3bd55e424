"""Training algorithms on TRL (worker-only: imports torch and TRL).

- `batch`: experiences → rollouts, group advantages, preference pairs (no TRL);
- `trl_bridge`: the one module that touches TRL internals (pinned to trl==1.16.0);
- `learner`: GRPO, DPO, SFT and MIX on a resident policy.
"""

from workers.algorithms.batch import (
    Rollout,
    TrainBatch,
    group_advantages,
    preference_pairs,
    rollout_from_experience,
)
from workers.algorithms.learner import (
    ALGORITHMS,
    Learner,
    LearnerSpec,
    NothingToTrain,
    spec_from_config,
)

__all__ = [
    "ALGORITHMS",
    "Learner",
    "LearnerSpec",
    "NothingToTrain",
    "Rollout",
    "TrainBatch",
    "group_advantages",
    "preference_pairs",
    "rollout_from_experience",
    "spec_from_config",
]
