"""Reward functions by name. Pure Python: scorers that need a model run in `workers/`.

A reward function takes the completion text and the task (its reference answer, tests,
metadata) plus the term's params, and returns a RewardResult: a float and named parts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class RewardResult:
    score: float
    parts: dict[str, float] = field(default_factory=dict)


class TaskLike(Protocol):
    domain: str
    reference: Any
    metadata: Mapping[str, Any]


RewardFn = Callable[..., RewardResult]


@dataclass(frozen=True)
class RewardSpec:
    name: str
    fn: RewardFn
    # Where it runs: "inline" in the explorer, or "reward" queue (sandboxes, models, judges).
    where: str = "inline"
    description: str = ""


_REGISTRY: dict[str, RewardSpec] = {}


def register(name: str, *, where: str = "inline", description: str = "") -> Callable[[RewardFn], RewardFn]:
    def decorate(fn: RewardFn) -> RewardFn:
        if name in _REGISTRY and _REGISTRY[name].fn is not fn:
            raise ValueError(f"reward {name!r} is registered twice")
        _REGISTRY[name] = RewardSpec(name=name, fn=fn, where=where, description=description or (fn.__doc__ or "").strip())
        return fn

    return decorate


def _load_builtins() -> None:
    # Importing the module registers the built-in rewards.
    from apps.rewards import builtin  # noqa: F401


def reward_names() -> set[str]:
    _load_builtins()
    return set(_REGISTRY)


def reward_get(name: str) -> RewardSpec:
    _load_builtins()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown reward {name!r}; known: {', '.join(sorted(_REGISTRY))}") from None
