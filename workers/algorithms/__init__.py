"""Training algorithms on TRL (worker-only: imports torch and TRL).

- `batch`: experiences → rollouts, group advantages, preference pairs (no TRL);
- `trl_bridge`: what every TRL trainer shares (pinned to trl==1.16.0);
- `objectives/`: each algorithm's objective (its TRL trainer and inputs, its loss);
- `learner`: a resident policy trained by any registered algorithm (and a rank's `Shard`);
- `sharding`: a learner on FSDP2/DDP shards (shard it, load a rank's rows, sharded snapshots,
  the whole model gathered for a version);
- `gang`: a learner as a gang of processes, rank 0's side (its followers are
  workers/trainer/follower.py).

The modules here import each other, never this package, whose re-exports are for the rooms
above (the trainer, the reward trainer, tests and benches).
"""

from workers.algorithms.batch import (
    Rollout,
    TrainBatch,
    group_advantages,
    preference_pairs,
    rollout_from_experience,
)
from workers.algorithms.learner import (
    Learner,
    spec_from_config,
)
from workers.algorithms.trainee import LearnerSpec, NothingToTrain

__all__ = [
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
