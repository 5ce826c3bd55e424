"""Kinds of the run's learned reward model as the web side knows them: what each needs,
declared once (`reward_model.kind` in the run config).

A kind is registered here by name with what the config must know of it — whether it can
measure its held-out accuracy by cross-validation over prompts, whether a version can start
from the previous version's weights — and its training and scoring live on the worker side
(`workers/reward/kinds/`, registered under the same name). The config and the reward
trainer read these declarations; nothing compares kind names. Adding one: a module here
(see `head.py`) listed in `_REGISTRY`'s built-ins, and its worker-side implementation.

No Django, no torch: imported by the config (pydantic) and the workers.
"""

from __future__ import annotations

from typing import ClassVar

from kernel.registry import Registry

# The kind a run gets when its config names none.
DEFAULT_REWARD_KIND = "head"


class RewardKind:
    """One reward-model kind's declaration. Subclasses set the class attributes;
    `reward_kind_register` makes one instance of each."""

    name: ClassVar[str]
    summary: ClassVar[str]
    # Held-out accuracy by k-fold cross-validation over prompts (`reward_model.crossval_folds`).
    crossval: ClassVar[bool] = False
    # A version can start from the previous version's weights (`reward_model.warm_start`).
    warm_start: ClassVar[bool] = False
    # Each score comes with a spread (an ensemble's disagreement) the selection rule reads.
    spread: ClassVar[bool] = False


# The kinds that ship with rftweb, one module each, registered on first use.
_REGISTRY: Registry[RewardKind] = Registry(what="reward-model kind", package=__name__,
                                           builtin=("head", "likelihood", "mlp", "lora", "classifier"))


def reward_kind_register(cls: type[RewardKind]) -> type[RewardKind]:
    """Class decorator: register one instance of `cls` under `cls.name` (once)."""
    _REGISTRY.add(cls.name, cls())
    return cls


def reward_kinds() -> list[RewardKind]:
    return _REGISTRY.entries()


def reward_kind_names() -> list[str]:
    return _REGISTRY.names()


def reward_kind_get(name: object) -> RewardKind:
    """The declaration registered as `name`; ValueError naming the known ones otherwise."""
    return _REGISTRY.get(name)
