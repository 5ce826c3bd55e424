"""Training algorithms as the web side knows them: what each needs, declared once.

An algorithm is registered here by name with what the rest of the loop must know of it —
whether it compares the completions of a group, whether it needs a frozen reference model,
what a train step claims from the buffer, when that batch is ready, whether its loss splits
over a learner group — and its loss lives beside the other losses on the worker side
(`workers/algorithms/objectives/`, registered under the same name). The config, the run
form, the conductor and the learner read these declarations; nothing compares algorithm
names. Adding one: a module here (see `grpo.py`) listed in `_REGISTRY`'s built-ins, and its
objective.

No Django, no torch: imported by the config (pydantic), the conductor and the workers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from kernel.registry import Registry

if TYPE_CHECKING:
    from kernel.config import RunConfig

# How TRL normalises each GRPO loss type, hence how a learner group weights each rank's
# part of a batch: a mean over sequences (each part by its share of the sequences) or over
# completion tokens (its share of the action tokens).
GROUP_PER_SEQUENCE = ("grpo", "dr_grpo", "sapo", "luspo")
GROUP_PER_TOKEN = ("dapo", "bnpo", "cispo", "vespo")


@dataclass(frozen=True)
class BatchPlan:
    """What a train step claims: how many of the model's own rollouts (whole groups or
    not), how many expert ones."""

    usual: int
    expert: int
    whole_groups: bool

    @property
    def size(self) -> int:
        return self.usual + self.expert


class AlgorithmType:
    """One training algorithm's declaration. Subclasses set the class attributes and
    override what differs; `algorithm_register` makes one instance of each."""

    name: ClassVar[str]
    summary: ClassVar[str]
    # Advantages are relative to the other completions of the task's group: a group needs
    # at least two (repeat_times >= 2), and a rule that scores them alike teaches nothing.
    group_relative: ClassVar[bool] = False
    # Trains on preference pairs drawn within a group (people's comparisons and rankings).
    preference_pairs: ClassVar[bool] = False
    # A frozen reference model: always (DPO's log-ratio), or only for a KL term (beta > 0).
    reference_always: ClassVar[bool] = False
    reference_for_kl: ClassVar[bool] = False
    # Its objective has a `shard_loss` (workers.algorithms.objectives): it trains as a
    # sharded learner group (workers.algorithms.distributed). Every built-in one does.
    learner_group: ClassVar[bool] = False
    # Values the new-run form fills in when this algorithm is picked (static/rftweb/newrun.js).
    form_defaults: ClassVar[dict[str, str]] = {}

    def needs_reference(self, *, beta: float) -> bool:
        return self.reference_always or (self.reference_for_kl and beta > 0)

    def batch_plan(self, cfg: RunConfig) -> BatchPlan:
        """What one train step claims. Default: the model's own rollouts, whole groups."""
        return BatchPlan(usual=cfg.train_batch_size, expert=0, whole_groups=True)

    def batch_ready(self, plan: BatchPlan, *, usual: int, expert: int) -> tuple[bool, bool]:
        """(a full batch is claimable, something is): what the trainer waits for."""
        if plan.expert:
            return expert >= plan.expert, expert > 0
        return usual >= plan.usual, usual > 0

    def group_refusal(self, *, loss_type: str, scale_rewards: str) -> str | None:
        """Why a learner of these settings cannot run as a group of processes (None: it can)."""
        if not self.learner_group:
            return f"{self.name} has no sharded objective (its objective's shard_loss); set processes: 1"
        return None


# The algorithms that ship with rftweb, one module each, registered on first use.
_REGISTRY: Registry[AlgorithmType] = Registry(what="algorithm", package=__name__,
                                              builtin=("grpo", "dpo", "sft", "mix"))


def algorithm_register(cls: type[AlgorithmType]) -> type[AlgorithmType]:
    """Class decorator: register one instance of `cls` under `cls.name` (once)."""
    _REGISTRY.add(cls.name, cls())
    return cls


def algorithm_unregister(name: str) -> None:
    _REGISTRY.remove(name)


def algorithms() -> list[AlgorithmType]:
    return _REGISTRY.entries()


def algorithm_names() -> list[str]:
    return _REGISTRY.names()


def algorithm_get(name: object) -> AlgorithmType:
    """The declaration registered as `name` (a str or a str enum); ValueError naming the
    known ones otherwise."""
    return _REGISTRY.get(name)
