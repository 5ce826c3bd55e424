"""SFT: supervised fine-tuning on expert experiences (corrections, demonstrations)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kernel.algorithms import AlgorithmType, BatchPlan, algorithm_register

if TYPE_CHECKING:
    from kernel.config import RunConfig


@algorithm_register
class SFT(AlgorithmType):
    name = "sft"
    objective = "workers.algorithms.objectives.sft:SFT"
    summary = "supervised fine-tuning on expert experiences"
    learner_gang = True
    form_defaults = {"repeat_times": "1", "trainer.learning_rate": "2e-05", "trainer.params": "",
                     "mode": "train"}

    def batch_plan(self, cfg: RunConfig) -> BatchPlan:
        return BatchPlan(usual=0, expert=cfg.train_batch_size, whole_groups=False)
