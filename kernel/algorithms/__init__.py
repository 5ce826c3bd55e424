"""Training algorithms as the web side knows them: what each needs, declared once.

An algorithm is registered here by name with what the rest of the loop must know of it —
its settings (`params`: the config's `trainer.params`), whether it compares the completions
of a group, whether it needs a frozen reference model, what a train step claims from the
buffer, when that batch is ready, whether its loss splits over a learner gang — and which
objective is its own on the worker side (`objective`: the class, or for the built-ins its
path in `workers/algorithms/objectives/`). The config, the run form, the conductor and the
learner read these declarations; nothing compares algorithm names. Adding one: one module
with its settings, objective and declaration, and `algorithm_register` (docs/how-to/
add-an-algorithm.md); a built-in is listed in `_REGISTRY`'s built-ins.

No Django, no torch: imported by the config (pydantic), the conductor and the workers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from pydantic import ConfigDict
from pydantic.config import JsonDict

from kernel.registry import Registry
from kernel.config_base import StrictModel

if TYPE_CHECKING:
    from kernel.config import RunConfig

# How TRL normalises each GRPO loss type, hence how a learner gang weights each rank's
# part of a batch: these take a mean over sequences (each part by its share of the
# sequences); the others (dapo, bnpo, cispo, vespo) over completion tokens (its share of the
# action tokens).
PER_SEQUENCE_LOSS_TYPES = ("grpo", "dr_grpo", "sapo", "luspo")


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


def _params_schema(schema: JsonDict, cls: type[object]) -> None:
    # The config's `trainer.params` is typed by this base, but holds the run's algorithm's
    # subclass (SerializeAsAny): the schema (OpenAPI's RunConfig among them) must take any
    # algorithm's keys, which the config's own validation checks against its `algorithm`.
    if cls is AlgorithmParams:
        schema["additionalProperties"] = True


class AlgorithmParams(StrictModel):
    """An algorithm's own settings: the run config's `trainer.params` when it is the run's
    algorithm (each algorithm's subclass, declared beside it; the learner's objective reads
    the same instance), validated as every config block. This base has none: an algorithm
    without settings of its own."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, json_schema_extra=_params_schema)


class AlgorithmType:
    """One training algorithm's declaration. Subclasses set the class attributes and
    override what differs; `algorithm_register` makes one instance of each."""

    def __init_subclass__(cls, **kwargs: object) -> None:
        # Round 64 renamed `learner_group` to `learner_gang`: an algorithm written on the old
        # name would be refused as one without a sharded objective, so it is refused where it
        # is declared, naming the new one.
        super().__init_subclass__()
        if "learner_group" in vars(cls):
            raise TypeError(f"{cls.__name__}.learner_group is now learner_gang (docs/concepts.md#names)")

    name: ClassVar[str]
    summary: ClassVar[str]
    # Advantages are relative to the other completions of the task's group: a group needs
    # at least two (repeat_times >= 2), and a rule that scores them alike teaches nothing.
    group_relative: ClassVar[bool] = False
    # Trains on preference pairs drawn within a group: its batches carry the pairs people
    # stated among their rollouts (workers.trainer.step; the feedback kinds whose labels reach
    # training as preferences), and those labels count as reaching its training
    # (apps.feedback.ledger).
    preference_pairs: ClassVar[bool] = False
    # Its settings (the config's `trainer.params`), validated when the run is configured.
    params: ClassVar[type[AlgorithmParams]] = AlgorithmParams
    # The old config's flat `trainer.<key>` settings that are this algorithm's, by the name
    # of its params field: configs written before `trainer.params` load (kernel/config.py)
    # and were migrated (apps/runs/migrations/0010) with these.
    legacy_keys: ClassVar[dict[str, str]] = {}
    # Its objective has a `shard_loss` (workers.algorithms.objectives): it trains as a
    # sharded learner gang (workers.algorithms.gang). Every built-in one does.
    learner_gang: ClassVar[bool] = False
    # Values the new-run form fills in when this algorithm is picked (static/rftweb/newrun.js).
    form_defaults: ClassVar[dict[str, str]] = {}
    # Its objective on the worker side (workers.algorithms.objectives.Objective): the class
    # itself where the declaration's file holds it (an algorithm added from a file of its
    # own), or its "module:Class" path (the built-ins: the web side never imports workers).
    objective: ClassVar[str | type] = ""

    def needs_reference(self, params: AlgorithmParams) -> bool:
        """Whether it needs a frozen reference model (for a KL term, a log-ratio); not by default."""
        return False

    def batch_plan(self, cfg: RunConfig) -> BatchPlan:
        """What one train step claims. Default: the model's own rollouts, whole groups."""
        return BatchPlan(usual=cfg.train_batch_size, expert=0, whole_groups=True)

    def batch_ready(self, plan: BatchPlan, *, usual: int, expert: int) -> tuple[bool, bool]:
        """(a full batch is claimable, something is): what the trainer waits for."""
        if plan.expert:
            return expert >= plan.expert, expert > 0
        return usual >= plan.usual, usual > 0

    def gang_refusal(self, params: AlgorithmParams) -> str | None:
        """Why a learner of these settings cannot run as a gang of processes (None: it can)."""
        if not self.learner_gang:
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


def algorithm_params_parse(name: object, value: AlgorithmParams | Mapping[str, object] | None) -> AlgorithmParams:
    """`value` as the settings of the algorithm registered as `name`: its params model's
    defaults for None, a mapping validated into it (pydantic's ValidationError names the
    field), an instance of that very model as it is (another model's: ValueError)."""
    model = algorithm_get(name).params
    if value is None:
        return model()
    if isinstance(value, AlgorithmParams):
        if type(value) is not model:
            raise ValueError(f"{name} takes {model.__name__} settings, not {type(value).__name__}")
        return value
    return model.model_validate(dict(value))


# The flat `trainer.<key>` settings of the config before each algorithm had its own
# `trainer.params` (round 48): every stored config holds all of them, defaults included.
LEGACY_TRAINER_KEYS = ("loss_type", "beta", "epsilon", "epsilon_high", "scale_rewards", "mu", "expert_share", "dpo_beta")


def trainer_legacy_upgrade(name: object, trainer: Mapping[str, object]) -> dict[str, object]:
    """An old-shaped `trainer` block in the shape of today: the flat settings that are the
    algorithm's (its `legacy_keys`) moved into `params`, the others dropped (each was some
    other algorithm's, ignored by this one). A block that has `params` already, or none of
    the old keys, is returned as it is (a copy)."""
    out = dict(trainer)
    if "params" in out or not any(key in out for key in LEGACY_TRAINER_KEYS):
        return out
    renames = algorithm_get(name).legacy_keys
    params = {renames[key]: out[key] for key in LEGACY_TRAINER_KEYS if key in out and key in renames}
    for key in LEGACY_TRAINER_KEYS:
        out.pop(key, None)
    out["params"] = params
    return out
