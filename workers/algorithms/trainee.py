"""What an algorithm's objective is built on, below both the learner and the objectives: the
learner's spec (`LearnerSpec`), the parts of a learner an objective reads (`Trainee`, which
`workers.algorithms.learner.Learner` is) and the refusal of a batch with nothing to learn
(`NothingToTrain`). The learner builds its objective (workers/algorithms/objectives/) and the
objectives read the learner, so what they share lives here rather than in either."""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import torch

from kernel.algorithms import AlgorithmParams, algorithm_get, algorithm_params_parse
from kernel.exceptions import Conflict
from workers.algorithms import trl_bridge as bridge
from workers.algorithms.batch import Rollout

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from kernel.config import AdapterConfig


class NothingToTrain(Conflict, ValueError):
    """The batch holds nothing this algorithm can learn from (no tokens, no pairs)."""

    code = "nothing_to_train"



@dataclass
class LearnerSpec:
    algorithm: str
    params: bridge.TrainParams = field(default_factory=bridge.TrainParams)
    # The algorithm's own settings (the config's `trainer.params`): an instance of its
    # declaration's params model, or a mapping validated into one; None: its defaults.
    algorithm_params: AlgorithmParams | Mapping[str, object] | None = None
    # fp32 | bf16 | fp16 (autocast; workers.precision) and activation recomputation.
    precision: str = "fp32"
    gradient_checkpointing: bool = False
    # The run's `trainer.lora` section, or None for full fine-tuning.
    lora: AdapterConfig | None = None
    # adamw | adamw_8bit (bitsandbytes, CUDA; workers.precision.optimizer_check)
    optimizer: str = "adamw"

    def __post_init__(self) -> None:
        self.algorithm_params = algorithm_params_parse(self.algorithm, self.algorithm_params)

    @property
    def settings(self) -> AlgorithmParams:
        """The algorithm's own settings, validated (`algorithm_params`)."""
        assert isinstance(self.algorithm_params, AlgorithmParams)
        return self.algorithm_params

    @property
    def needs_ref(self) -> bool:
        return algorithm_get(self.algorithm).needs_reference(self.settings)

    @property
    def needs_ref_model(self) -> bool:
        """A separate reference model: not with an adapter, whose base is the reference."""
        return self.needs_ref and self.lora is None


class Trainee(Protocol):
    """What an objective reads of the learner it is built on (`Objective(learner)`)."""

    spec: LearnerSpec
    model: torch.nn.Module
    # What the losses call: the model, or its DistributedDataParallel wrapper in a gang.
    forward_model: torch.nn.Module
    tokenizer: PreTrainedTokenizerBase
    ref_model: torch.nn.Module | None

    def pixel_inputs(self, rollouts: list[Rollout]) -> dict[str, torch.Tensor | list[int]]:
        """The pictures of image prompts as the model's pixel inputs."""
        ...

    def reference(self) -> AbstractContextManager[torch.nn.Module]:
        """The KL reference to score with, for as long as the block lasts."""
        ...
