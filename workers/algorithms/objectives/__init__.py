"""Each algorithm's objective on the learner: its loss on a batch, whether a batch can move
the weights at all, and how its rows split over a learner group.

Registered under the same name as the algorithm's declaration (`apps.runs.algorithms`),
which says what the rest of the loop must know of it; `Learner` builds the TRL trainers an
objective names in `trainers` and calls it, never comparing algorithm names. Adding one: a
module here (see `grpo.py`) listed in `_REGISTRY`'s built-ins.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from rftweb.registry import Registry

if TYPE_CHECKING:
    import torch

    from workers.algorithms.batch import Rollout, TrainBatch
    from workers.algorithms.learner import Learner


class Objective:
    name: ClassVar[str]
    # The TRL trainers whose `compute_loss` this objective borrows (workers.algorithms.trl_bridge).
    trainers: ClassVar[tuple[str, ...]]

    def loss(self, learner: Learner, batch: TrainBatch) -> tuple[torch.Tensor, dict[str, float]]:
        raise NotImplementedError

    def no_signal(self, learner: Learner, batch: TrainBatch) -> str | None:
        """Why `batch` cannot move the weights (None: it can, or only the loss can tell)."""
        return None

    # -- a learner group (only objectives whose declaration says `learner_group`) ---------

    def group_rows(self, batch: TrainBatch) -> tuple[list[Rollout], bool]:
        """(the rows this objective trains on, whether they are dealt as whole groups)."""
        raise NotImplementedError(f"{self.name} does not run as a learner group")

    def group_part(self, rows: list[Rollout]) -> TrainBatch:
        """One rank's part of the rows as a batch this objective trains on."""
        raise NotImplementedError(f"{self.name} does not run as a learner group")

    def group_share(self, learner: Learner, rows: list[Rollout], mine: list[Rollout]) -> float:
        """The weight of one rank's part: its share of the completion tokens by default
        (token-mean losses); a per-sequence loss overrides it."""
        return sum(len(r.completion_ids) for r in mine) / sum(len(r.completion_ids) for r in rows)


_REGISTRY: Registry[Objective] = Registry(what="algorithm", package=__name__,
                                          builtin=("grpo", "dpo", "sft", "mix"))


def objective_register(cls: type[Objective]) -> type[Objective]:
    _REGISTRY.add(cls.name, cls())
    return cls


def objective_unregister(name: str) -> None:
    _REGISTRY.remove(name)


def objective_get(name: str) -> Objective:
    return _REGISTRY.get(name)
