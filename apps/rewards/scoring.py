"""Routing and combining a run's reward terms: the contract the explorer and the reward
worker call.

A run's `rewards` list (RewardTerm: name, weight, params, domains) applies to a task when
the term's `domains` is empty or names the task's domain. An empty list means the default
routes: math → math_accuracy + 0.1 × math_format, code → code_exec, k12 → k12_judge
(apps/rewards/k12_rules.py), vision → vision_answer (apps/rewards/vision_rules.py), anything
else → exact_match. A term's `domains` must name registered domains (kernel.plugin_names.domains): a misspelt one is a
config error naming it, not a term that silently scores nothing; a task's domain that
misspells a routed one (`K12`) is refused at import (`domain_misspelt`), not scored by the
fallback. Each term's score is
stored as a part under its key (the term's name; a name
repeated in one spec gets "#2", "#3"…), and the reward is the weighted sum of the parts.
Inline terms are scored by the explorer; terms registered `where="reward"` (code, reward
models, judges) on the Celery queue `reward` (workers/reward/scoring.py).
"""

from __future__ import annotations

import functools
import logging
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from kernel.rewards import RewardResult, domain_routes, reward_get, task_field
from kernel.config import RewardTerm, RunConfig
from kernel.plugin_names import DEFAULT_DOMAIN, TASKSET_CHECKS, domain_misspelt, domain_misspelt_message

if TYPE_CHECKING:
    from apps.buffer.models import Taskset

log = logging.getLogger(__name__)

def default_routes() -> dict[str, tuple[RewardTerm, ...]]:
    """Each registered domain's default terms (kernel.rewards.domain_register)."""
    return {
        name: tuple(RewardTerm(name=reward, weight=weight, domains=[name]) for reward, weight in route.terms)
        for name, route in domain_routes().items()
    }


@functools.cache
def default_other() -> tuple[RewardTerm, ...]:
    return (RewardTerm(name="exact_match", weight=1.0),)


def _all_defaults() -> list[RewardTerm]:
    return [t for route in default_routes().values() for t in route] + list(default_other())


def term_keys(terms: Sequence[RewardTerm]) -> list[str]:
    """The part name of each term: its name, with "#n" for the n-th repeat of a name."""
    seen: dict[str, int] = {}
    keys = []
    for term in terms:
        seen[term.name] = seen.get(term.name, 0) + 1
        keys.append(term.name if seen[term.name] == 1 else f"{term.name}#{seen[term.name]}")
    return keys


def task_domain(task: object) -> str:
    return str(task_field(task, "domain") or DEFAULT_DOMAIN)


def rewards_for_domain(*, terms: Sequence[RewardTerm], domain: str) -> list[tuple[str, RewardTerm]]:
    """(key, term) for every term that applies to `domain`, defaults when `terms` is empty."""
    if not terms:
        route = default_routes().get(domain, default_other())
        return [(t.name, t) for t in route]
    return [(key, t) for key, t in zip(term_keys(terms), terms, strict=True) if not t.domains or domain in t.domains]


def rewards_unrouted_domains(*, terms: Sequence[RewardTerm], domains: Iterable[str]) -> list[str]:
    """The domains (of a taskset) that no term of an explicit spec applies to, sorted: their
    tasks would get no reward at all. An empty spec routes every domain."""
    return sorted({d for d in domains if terms and not rewards_for_domain(terms=terms, domain=d)})


def _is_remote(term: RewardTerm) -> bool:
    return reward_get(term.name).where == "reward"


def rewards_remote_terms(terms: Sequence[RewardTerm]) -> list[RewardTerm]:
    """The terms scored on queue `reward` (of the defaults when `terms` is empty), any domain."""
    return [t for t in (terms or _all_defaults()) if _is_remote(t)]


def rewards_awaiting(*, terms: Sequence[RewardTerm], task: object) -> list[str]:
    """Keys of the remote terms that apply to this task: what `metadata["awaiting_rewards"]` holds."""
    return [key for key, t in rewards_for_domain(terms=terms, domain=task_domain(task)) if _is_remote(t)]


def reward_term_score(*, term: RewardTerm, completion: str, task: object) -> float:
    """One term's score, finite; a reward function that fails on untrusted text scores 0."""
    spec = reward_get(term.name)
    try:
        result = spec.fn(completion, task, **term.params)
    except Exception:
        log.exception("reward %s failed", term.name)
        return 0.0
    score = float(result.score if isinstance(result, RewardResult) else result)
    return score if math.isfinite(score) else 0.0


def rewards_inline(*, terms: Sequence[RewardTerm], completion: str, task: object) -> RewardResult:
    """Score the inline terms that apply to the task's domain; the score is their weighted sum."""
    parts: dict[str, float] = {}
    for key, term in rewards_for_domain(terms=terms, domain=task_domain(task)):
        if _is_remote(term):
            continue
        parts[key] = reward_term_score(term=term, completion=completion, task=task)
    return RewardResult(reward_combine(terms=terms, parts=parts), parts)


def reward_combine(*, terms: Sequence[RewardTerm], parts: Mapping[str, float]) -> float:
    """Weighted sum of the parts present; a part whose term is not in the spec counts nothing."""
    keyed = dict(zip(term_keys(terms), terms, strict=True)) if terms else {t.name: t for t in _all_defaults()}
    return float(sum(keyed[key].weight * float(value) for key, value in parts.items() if key in keyed))


def taskset_routing_errors(cfg: RunConfig, taskset: Taskset) -> dict[str, str]:
    """The rewards' check of a run's taskset (registered with kernel.plugin_names): every
    domain of its tasks is scored by a term of `cfg.rewards`; with the default routes, no
    task's domain misspells a routed one (imported before the importers refused it, it would
    be scored by exact_match instead)."""
    domains = taskset.tasks.values_list("domain", flat=True).distinct()
    if cfg.rewards:
        unrouted = rewards_unrouted_domains(terms=cfg.rewards, domains=domains)
        if unrouted:
            return {"rewards": (f"no reward term scores the taskset's tasks of domain {unrouted[0]!r}: add a term "
                                f"with domains: [{unrouted[0]}] or one without domains")}
        return {}
    for domain in domains.order_by("domain"):
        known = domain_misspelt(domain)
        if known is not None:
            return {"taskset": f"tasks of taskset {taskset.name!r}: {domain_misspelt_message(domain, known)}"}
    return {}


# The kernel runs it at a run's start (kernel.plugin_names.taskset_errors), loading this module
# by name.
TASKSET_CHECKS.add("rewards", taskset_routing_errors)
