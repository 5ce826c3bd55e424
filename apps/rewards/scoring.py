"""Scoring a completion with a run's reward terms.

Minimal version written on the explorer branch to fix the contract the explorer calls; the
rewards part replaces this module (same names, same signatures).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from apps.rewards.registry import RewardResult, reward_get


def _applies(term: Any, task: Any) -> bool:
    domains = list(getattr(term, "domains", None) or [])
    return not domains or getattr(task, "domain", None) in domains


def rewards_remote_terms(terms: Sequence[Any]) -> list[Any]:
    """The terms that must run on the `reward` queue (sandboxes, models, judges)."""
    return [term for term in terms if reward_get(term.name).where != "inline"]


def rewards_inline(*, terms: Sequence[Any], completion: str, task: Any) -> RewardResult:
    """Weighted sum of the inline terms that apply to the task's domain; parts by term name."""
    score = 0.0
    parts: dict[str, float] = {}
    for term in terms:
        spec = reward_get(term.name)
        if spec.where != "inline" or not _applies(term, task):
            continue
        result = spec.fn(completion, task, **dict(term.params))
        parts[term.name] = float(result.score)
        score += float(term.weight) * float(result.score)
    return RewardResult(score=score, parts=parts)
