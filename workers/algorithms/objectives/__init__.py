"""Each algorithm's objective on the learner: its loss on a batch, whether a batch can move
the weights at all, and how its rows split over a learner group.

Registered under the same name as the algorithm's declaration (`kernel.algorithms`),
which says what the rest of the loop must know of it; `Learner` builds the TRL trainers an
objective names in `trainers` and calls it, never comparing algorithm names. Adding one: a
module here (see `grpo.py`) listed in `_REGISTRY`'s built-ins.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, ClassVar, TypeVar

from kernel.registry import Registry

if TYPE_CHECKING:
    import torch

    from workers.algorithms.batch import Rollout, TrainBatch
    from workers.algorithms.learner import Learner

R = TypeVar("R")


class Objective:
    name: ClassVar[str]
    # The TRL trainers whose `compute_loss` this objective borrows (workers.algorithms.trl_bridge).
    trainers: ClassVar[tuple[str, ...]]

    def loss(self, learner: Learner, batch: TrainBatch) -> tuple[torch.Tensor, dict[str, float]]:
        raise NotImplementedError

    def no_signal(self, learner: Learner, batch: TrainBatch) -> str | None:
        """Why `batch` cannot move the weights (None: it can, or only the loss can tell)."""
        return None

    # -- a learner group ---------------------------------------------------------------

    def shard_loss(self, learner: Learner, batch: TrainBatch, *, rank: int, world: int) -> tuple[torch.Tensor, dict[str, float]]:
        """Rank `rank`'s term of the objective on the whole `batch`: summed over the `world`
        ranks the terms are `loss(batch)`, so the group's update is the one-process update.
        Every rank gets the whole batch and must call the model the same number of times (the
        FSDP2 collectives run in each forward and backward): a rank whose part is empty
        computes the loss on a borrowed row and weights it by zero. Whatever makes the
        whole batch untrainable raises NothingToTrain on every rank alike."""
        raise NotImplementedError(f"{self.name} does not run as a learner group")


def weighted_part(
    loss_on: Callable[[list[R]], tuple[torch.Tensor, dict[str, float]]], rows: list[R], *, rank: int, world: int,
    weight: Callable[[list[R]], float],
) -> tuple[torch.Tensor, dict[str, float]]:
    """`loss_on` this rank's dealt part of `rows`, times the part's share of `weight(rows)`
    (rows: sequences for a per-sequence mean, completion tokens for a per-token mean, pairs
    for DPO). An empty part runs the loss on the first row and weights it by zero."""
    from workers.algorithms.batch import deal

    mine = deal(rows, world)[rank]
    if not mine:
        loss, _ = loss_on(rows[:1])
        return loss * 0.0, {}
    loss, metrics = loss_on(mine)
    return loss * (weight(mine) / weight(rows)), metrics


_REGISTRY: Registry[Objective] = Registry(what="algorithm", package=__name__,
                                          builtin=("grpo", "dpo", "sft", "mix"))


def objective_register(cls: type[Objective]) -> type[Objective]:
    _REGISTRY.add(cls.name, cls())
    return cls


def objective_unregister(name: str) -> None:
    _REGISTRY.remove(name)


def objective_get(name: str) -> Objective:
    return _REGISTRY.get(name)
