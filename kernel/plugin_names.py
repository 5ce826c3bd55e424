"""The names a run config may use that plugins define: reward functions and reward domains
(kernel/rewards.py, filled by apps/rewards' modules), pipeline operators (kernel/operators.py,
filled by apps/buffer/pipeline's) and what a taskset must satisfy for the run's rewards to
score it.

The kernel declares each of these as a Registry (kernel/registry.py) that loads its plugin
modules by name on first use, so validating a config needs no Django and no AppConfig.ready:
any process that imports the kernel sees every built-in name.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping
from typing import TYPE_CHECKING, Any

from kernel import operators, rewards
from kernel.registry import Registry

if TYPE_CHECKING:
    from kernel.config import RunConfig

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
# taskset is a buffer Taskset, which the kernel cannot name. The rewards app's routing check
# registers itself when apps/rewards/scoring.py is imported.
TasksetCheck = Callable[["RunConfig", Any], dict[str, str]]
TASKSET_CHECKS: Registry[TasksetCheck] = Registry(what="taskset check", package="apps.rewards",
                                                  builtin=("scoring",))


def domains() -> tuple[str, ...]:
    """The reward domains a term may name: the fallback, then every registered one."""
    return (DEFAULT_DOMAIN, *(d for d in rewards.domain_routes() if d != DEFAULT_DOMAIN))


def reward_names() -> Collection[str]:
    return rewards.reward_names()


def reward_params_check(name: str, params: Mapping[str, object]) -> None:
    """Raise ValueError naming what is wrong with a term's params."""
    rewards.reward_params_check(name=name, params=params)


def operator_names() -> Collection[str]:
    return operators.operator_names()


def operator_params_check(name: str, params: Mapping[str, object]) -> None:
    operators.params_check(name, params)


def operator_stage_check(name: str, stage: str) -> None:
    operators.stage_check(name, stage)


def taskset_errors(*, config: RunConfig, taskset: Any) -> dict[str, str]:
    """What the registered checks find wrong with `taskset` under `config` (first check wins)."""
    for check in TASKSET_CHECKS.entries():
        errors = check(config, taskset)
        if errors:
            return errors
    return {}
