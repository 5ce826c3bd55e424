"""Routing and combining a run's reward terms: the contract the explorer and the reward
worker call.

A run's `rewards` list (RewardTerm: name, weight, params, domains) applies to a task when
the term's `domains` is empty or names the task's domain. An empty list means the default
routes: math → math_accuracy + 0.1 × math_format, code → code_exec, k12 → k12_judge
(apps/rewards/k12.py), vision → vision_answer (apps/rewards/vision_rules.py), anything
else → exact_match. A term's `domains` must name domains of DOMAINS: a misspelt one is a
config error naming it, not a term that silently scores nothing; a task's domain that
misspells a routed one (`K12`) is refused at import (`domain_misspelt`), not scored by the
fallback. Each term's score is
stored as a part under its key (the term's name; a name
repeated in one spec gets "#2", "#3"…), and the reward is the weighted sum of the parts.
Inline terms are scored by the explorer; terms registered `where="reward"` (code, reward
models, judges) on the Celery queue `reward` (workers/rewards.py).
"""

from __future__ import annotations

import functools
import logging
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from apps.rewards.registry import RewardResult, reward_get, task_field
from apps.runs.config import RewardTerm

log = logging.getLogger(__name__)

DEFAULT_DOMAIN = "general"
# The domains rewards are routed by: each one but the fallback has a route in default_routes.
DOMAINS = (DEFAULT_DOMAIN, "math", "code", "k12", "vision")


def _domain_key(domain: str) -> str:
    return re.sub(r"[\s_-]+", "", domain).casefold()


def domain_misspelt(domain: str) -> str | None:
    """The routed domain that `domain` is a misspelling of (`K12`, `Math `, `k-12`: case,
    spaces, `-` and `_` aside the same), else None. Such a task would silently get the
    fallback's exact_match instead of its domain's rewards, so the doors refuse it; any
    other unknown domain (`chat`, `trivia`) is a domain of its own, scored as "anything else"."""
    if domain in DOMAINS:
        return None
    key = _domain_key(domain)
    return next((known for known in DOMAINS if _domain_key(known) == key), None)


def domain_misspelt_message(domain: str, known: str) -> str:
    return (f"domain {domain!r} is not a reward domain; did you mean {known!r}? (domains are exact: "
            f"{', '.join(DOMAINS)}; any other is scored by exact_match)")


@functools.cache
def default_routes() -> dict[str, tuple[RewardTerm, ...]]:
    return {
        "math": (
            RewardTerm(name="math_accuracy", weight=1.0, domains=["math"]),
            RewardTerm(name="math_format", weight=0.1, domains=["math"]),
        ),
        "code": (RewardTerm(name="code_exec", weight=1.0, domains=["code"]),),
        "k12": (RewardTerm(name="k12_judge", weight=1.0, domains=["k12"]),),
        "vision": (RewardTerm(name="vision_answer", weight=1.0, domains=["vision"]),),
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


def task_domain(task: Any) -> str:
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


def rewards_awaiting(*, terms: Sequence[RewardTerm], task: Any) -> list[str]:
    """Keys of the remote terms that apply to this task: what `metadata["awaiting_rewards"]` holds."""
    return [key for key, t in rewards_for_domain(terms=terms, domain=task_domain(task)) if _is_remote(t)]


def reward_term_score(*, term: RewardTerm, completion: str, task: Any) -> float:
    """One term's score, finite; a reward function that fails on untrusted text scores 0."""
    spec = reward_get(term.name)
    try:
        result = spec.fn(completion, task, **term.params)
    except Exception:
        log.exception("reward %s failed", term.name)
        return 0.0
    score = float(result.score if isinstance(result, RewardResult) else result)
    return score if math.isfinite(score) else 0.0


def rewards_inline(*, terms: Sequence[RewardTerm], completion: str, task: Any) -> RewardResult:
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
