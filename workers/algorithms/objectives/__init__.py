"""Each algorithm's objective on the learner, one module each: the TRL trainer it borrows a
loss from and the inputs it builds for it, its loss on a batch, whether a batch can move the
weights at all, and its term of the loss on one rank of a learner gang.

An objective is built once per `Learner` (`Objective(learner)`) and keeps what it built
(its TRL trainers); the learner keeps what every algorithm shares (the models, the
reference, the optimizer, the precision, the step) and never names an algorithm. Which
objective an algorithm has, its declaration says (`objective` in `kernel.algorithms`,
a class or a "module:Class" path): one registry, the declarations', so an algorithm added
from a file of its own is one `algorithm_register` line.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, ClassVar, TypeVar
from kernel.algorithms import algorithm_get
from workers.algorithms import trl_bridge
from workers.algorithms.batch import deal
from workers.algorithms.trainee import Trainee

if TYPE_CHECKING:
    import torch

    from workers.algorithms.batch import TrainBatch
    from workers.algorithms.trl_bridge import TrlTrainer

R = TypeVar("R")


class Objective:
    name: ClassVar[str]

    def __init_subclass__(cls, **kwargs: object) -> None:
        # Round 49 renamed `no_signal` to `no_gradient`: an objective written on the old name
        # would have its check silently ignored, so it is refused where it is declared.
        super().__init_subclass__()
        if "no_signal" in vars(cls):
            raise TypeError(f"{cls.__name__}.no_signal is now no_gradient (docs/concepts.md#names)")

    def __init__(self, learner: Trainee) -> None:
        """Build what the loss needs around `learner`'s model (its TRL trainers)."""
        self.learner = learner
        self._plain: TrlTrainer | None = None

    @property
    def trainer(self) -> TrlTrainer:
        """The trainer whose optimizer and scheduler the learner uses (its arguments: AdamW,
        the learning rate, the schedule; workers.algorithms.trl_bridge.optimizer_build): the
        TRL trainer an objective borrows its loss from; by default (a loss of its own) a
        plain transformers Trainer, which makes the same AdamW."""
        if self._plain is None:
            self._plain = trl_bridge.plain_trainer_build(model=self.learner.model, params=self.learner.spec.params)
        return self._plain

    def loss(self, batch: TrainBatch) -> tuple[torch.Tensor, dict[str, float]]:
        raise NotImplementedError

    def no_gradient(self, batch: TrainBatch) -> str | None:
        """Why `batch` cannot move the weights (None: it can, or only the loss can tell)."""
        return None

    # -- a learner gang ---------------------------------------------------------------

    def shard_loss(self, batch: TrainBatch, *, rank: int, world: int) -> tuple[torch.Tensor, dict[str, float]]:
        """Rank `rank`'s term of the objective on the whole `batch`: summed over the `world`
        ranks the terms are `loss(batch)`, so the gang's update is the one-process update.
        Every rank gets the whole batch and must call the model the same number of times (the
        FSDP2 collectives run in each forward and backward): a rank whose part is empty
        computes the loss on a borrowed row and weights it by zero. Whatever makes the
        whole batch untrainable raises NothingToTrain on every rank alike."""
        raise NotImplementedError(f"{self.name} does not run as a learner gang")

    @classmethod
    def shards(cls) -> bool:
        """Whether it has a `shard_loss`, hence trains as a learner gang."""
        return cls.shard_loss is not Objective.shard_loss


def weighted_part(
    loss_on: Callable[[list[R]], tuple[torch.Tensor, dict[str, float]]], rows: list[R], *, rank: int, world: int,
    weight: Callable[[list[R]], float],
) -> tuple[torch.Tensor, dict[str, float]]:
    """`loss_on` this rank's dealt part of `rows`, times the part's share of `weight(rows)`
    (rows: sequences for a per-sequence mean, completion tokens for a per-token mean, pairs
    for DPO). An empty part runs the loss on the first row and weights it by zero."""

    mine = deal(rows, world)[rank]
    if not mine:
        loss, _ = loss_on(rows[:1])
        return loss * 0.0, {}
    loss, metrics = loss_on(mine)
    return loss * (weight(mine) / weight(rows)), metrics


def objective_class(name: object) -> type[Objective]:
    """The objective the algorithm registered as `name` declares (ValueError naming the
    known algorithms for an unknown name; TypeError for a declaration naming no objective)."""

    declared = algorithm_get(name).objective
    if isinstance(declared, str):
        module, _, attr = declared.partition(":")
        declared = getattr(importlib.import_module(module), attr)
    if not (isinstance(declared, type) and issubclass(declared, Objective)):
        raise TypeError(f"algorithm {name!r} declares {declared!r} as its objective, not an Objective class")
    return declared
