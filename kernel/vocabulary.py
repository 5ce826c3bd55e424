"""The names a run config may use that the apps above the kernel define: reward functions
(apps.rewards.registry), pipeline operators (apps.buffer.pipeline.registry) and what a
taskset must satisfy for the run's rewards to score it.

The kernel (apps.runs) validates a RunConfig in its constructor but may not import the apps
above it (the import-linter contract in pyproject.toml), so each of those apps hands its
names and checks to this registry in its AppConfig.ready(). Django calls every ready()
before any request, task or command runs, so a config is never validated against a partial
vocabulary; outside Django (no apps loaded) validation fails loudly instead of silently
accepting any name.

The reward domains are registered by the rewards app beside the rewards that score them
(apps.rewards.registry.domain_register); `domains()` is every registered one and the fallback.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from kernel.config import RunConfig

T = TypeVar("T")

# Tasks without a domain, and of any unregistered one, are scored by the fallback route.
DEFAULT_DOMAIN = "general"


def _domain_key(domain: str) -> str:
    return re.sub(r"[\s_-]+", "", domain).casefold()


def domain_misspelt(domain: str) -> str | None:
    """The routed domain that `domain` is a misspelling of (`K12`, `Math `, `k-12`: case,
    spaces, `-` and `_` aside the same), else None. Such a task would silently get the
    fallback's exact_match instead of its domain's rewards, so the doors refuse it; any
    other unknown domain (`chat`, `trivia`) is a domain of its own, scored as "anything else"."""
    known_domains = domains()
    if domain in known_domains:
        return None
    key = _domain_key(domain)
    return next((known for known in known_domains if _domain_key(known) == key), None)


def domain_misspelt_message(domain: str, known: str) -> str:
    return (f"domain {domain!r} is not a reward domain; did you mean {known!r}? (domains are exact: "
            f"{', '.join(domains())}; any other is scored by exact_match)")


# (config, taskset) -> {field: message}; a taskset check runs for a run with a taskset. The
# taskset is a buffer Taskset, which this app (below the buffer) cannot name.
TasksetCheck = Callable[["RunConfig", Any], dict[str, str]]


@dataclass
class _Vocabulary:
    domain_names: Callable[[], Collection[str]] | None = None
    reward_names: Callable[[], Collection[str]] | None = None
    # Raises ValueError naming the bad param.
    reward_params_check: Callable[[str, Mapping[str, object]], None] | None = None
    operator_names: Callable[[], Collection[str]] | None = None
    operator_params_check: Callable[[str, Mapping[str, object]], object] | None = None
    operator_stage_check: Callable[[str, str], None] | None = None
    taskset_checks: list[TasksetCheck] = field(default_factory=list)


_VOCABULARY = _Vocabulary()


class VocabularyMissing(RuntimeError):
    """A config was validated before the app that defines its names was loaded."""


def rewards_register(*, names: Callable[[], Collection[str]],
                     params_check: Callable[[str, Mapping[str, object]], None],
                     taskset_check: TasksetCheck,
                     domain_names: Callable[[], Collection[str]]) -> None:
    """apps.rewards: its reward names, their params check, the taskset routing check and
    the reward domains it routes."""
    _VOCABULARY.domain_names = domain_names
    _VOCABULARY.reward_names = names
    _VOCABULARY.reward_params_check = params_check
    if taskset_check not in _VOCABULARY.taskset_checks:
        _VOCABULARY.taskset_checks.append(taskset_check)


def operators_register(*, names: Callable[[], Collection[str]],
                       params_check: Callable[[str, Mapping[str, object]], object],
                       stage_check: Callable[[str, str], None]) -> None:
    """apps.buffer: its pipeline operators, their params check and where each may run."""
    _VOCABULARY.operator_names = names
    _VOCABULARY.operator_params_check = params_check
    _VOCABULARY.operator_stage_check = stage_check


def _need(hook: T | None, what: str) -> T:
    if hook is None:
        raise VocabularyMissing(f"no {what} are registered: load the Django apps (django.setup()) first")
    return hook


def domains() -> tuple[str, ...]:
    """The reward domains a term may name: the fallback, then every registered one."""
    registered = _need(_VOCABULARY.domain_names, "reward domains")()
    return (DEFAULT_DOMAIN, *(d for d in registered if d != DEFAULT_DOMAIN))


def reward_names() -> Collection[str]:
    return _need(_VOCABULARY.reward_names, "reward functions")()


def reward_params_check(name: str, params: Mapping[str, object]) -> None:
    _need(_VOCABULARY.reward_params_check, "reward functions")(name, params)


def operator_names() -> Collection[str]:
    return _need(_VOCABULARY.operator_names, "pipeline operators")()


def operator_params_check(name: str, params: Mapping[str, object]) -> None:
    _need(_VOCABULARY.operator_params_check, "pipeline operators")(name, params)


def operator_stage_check(name: str, stage: str) -> None:
    _need(_VOCABULARY.operator_stage_check, "pipeline operators")(name, stage)


def taskset_errors(*, config: RunConfig, taskset: Any) -> dict[str, str]:
    """What the registered checks find wrong with `taskset` under `config` (first check wins)."""
    for check in _VOCABULARY.taskset_checks:
        errors = check(config, taskset)
        if errors:
            return errors
    return {}
