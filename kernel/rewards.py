"""Reward functions and reward domains by name: the kernel's registries, which the rewards
app's modules fill when they are imported (apps/rewards/builtin_rules.py, math_rules.py, …). Pure
Python: scorers that need a model run in `workers/`. The run config (kernel/config.py)
validates reward names, params and domains here, so it needs no Django.

A reward function takes the completion text and the task (its reference answer, tests,
metadata) plus the term's params, and returns a RewardResult: a float and named parts.
A function registered with `where="reward"` is scored on the Celery queue `reward`
(sandboxes, reward models, judges) instead of inline in the explorer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from kernel.registry import Registry


@dataclass(frozen=True)
class RewardResult:
    score: float
    parts: dict[str, float] = field(default_factory=dict)


RewardFn = Callable[..., RewardResult]
# Raises ValueError with a message naming the bad param; run validation shows it.
ParamsCheck = Callable[[Mapping[str, object]], None]


def booleans_check(function: str, *names: str) -> ParamsCheck:
    """The check of a reward function whose params `names` are true or false when given."""

    def check(params: Mapping[str, object]) -> None:
        for name in names:
            if name in params and not isinstance(params[name], bool):
                raise ValueError(f"{function}: {name} must be true or false")

    return check

WHERE = ("inline", "reward")


@dataclass(frozen=True)
class RewardSpec:
    name: str
    fn: RewardFn
    # Where it runs: "inline" in the explorer, or "reward" queue (sandboxes, models, judges).
    where: str = "inline"
    description: str = ""
    check: ParamsCheck | None = None


# The modules of apps/rewards that register rewards and domains when imported, found by their
# name (`*_rules.py`) and loaded on first use (the kernel imports no app), so a process without
# Django knows them too. Adding one is adding its module.
PLUGINS = "apps.rewards"
REWARDS: Registry[RewardSpec] = Registry(what="reward", package=PLUGINS, suffix="_rules")


def register(
    name: str, *, where: str = "inline", description: str = "", check: ParamsCheck | None = None
) -> Callable[[RewardFn], RewardFn]:
    if where not in WHERE:
        raise ValueError(f"reward {name!r}: where must be one of {WHERE}, got {where!r}")

    def decorate(fn: RewardFn) -> RewardFn:
        REWARDS.add(name, RewardSpec(
            name=name, fn=fn, where=where, description=description or (fn.__doc__ or "").strip(), check=check
        ))
        return fn

    return decorate


@dataclass(frozen=True)
class DomainRoute:
    """A reward domain: the terms (reward name -> weight) that score its tasks when a run
    names no reward terms of its own. Tasks of any unregistered domain get exact_match."""

    name: str
    terms: tuple[tuple[str, float], ...]
    # The reward whose full score (1.0) says an answer is right: what the held-out evaluation
    # reports as accuracy (workers/explore/evaluation.py). None: the domain has no verifier (a judge
    # or a learned grader scores it), so no accuracy is reported for it.
    verifier: str | None = None
    # The reward that checks the answer's form alone (1.0: well formed): the format share.
    format: str | None = None


DOMAINS: Registry[DomainRoute] = Registry(what="reward domain", package=PLUGINS, suffix="_rules")


def domain_register(
    name: str, *, terms: Mapping[str, float], verifier: str | None = None, format: str | None = None
) -> None:
    """Register a reward domain and its default terms, next to the rewards that score it
    (math_rules.py registers `math`), with its verifier and format check when it has them.
    The run config learns the name through kernel.plugin_names.domains."""
    DOMAINS.add(name, DomainRoute(name=name, terms=tuple((reward, float(weight)) for reward, weight in terms.items()),
                                  verifier=verifier, format=format))


def domain_routes() -> dict[str, DomainRoute]:
    """By name: the order modules registered in depends on who imported them first."""
    routes = {route.name: route for route in DOMAINS.entries()}
    return {name: routes[name] for name in sorted(routes)}


def reward_names() -> set[str]:
    return set(REWARDS.names())


def reward_get(name: str) -> RewardSpec:
    try:
        return REWARDS.get(name)
    except ValueError:
        raise KeyError(f"unknown reward {name!r}; known: {', '.join(sorted(REWARDS.names()))}") from None


def reward_params_check(*, name: str, params: Mapping[str, object]) -> None:
    """Raise ValueError naming what is wrong with a term's params (a bad regex, a missing model)."""
    spec = reward_get(name)
    if spec.check is not None:
        spec.check(params)


def task_field(task: object, name: str, default: object = None) -> object:
    """Read a field from a Task row, a dataclass or a plain mapping alike."""
    if isinstance(task, Mapping):
        return task.get(name, default)
    return getattr(task, name, default)


def reference_text(task: object) -> str:
    ref = task_field(task, "reference")
    if isinstance(ref, Mapping):
        ref = next((ref[k] for k in ("answer", "reference", "solution", "ground_truth") if k in ref), "")
    return "" if ref is None else str(ref)
