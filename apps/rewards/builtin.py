"""Built-in rule rewards."""

from __future__ import annotations

import re
from typing import Any

from apps.rewards.registry import RewardResult, register


def _reference_text(task: Any) -> str:
    ref = getattr(task, "reference", None)
    if isinstance(ref, dict):
        ref = ref.get("answer", "")
    return "" if ref is None else str(ref)


@register("exact_match", description="1 when the stripped completion equals the reference answer")
def exact_match(completion: str, task: Any, **params: Any) -> RewardResult:
    ok = completion.strip() == _reference_text(task).strip()
    return RewardResult(float(ok), {"exact_match": float(ok)})


@register("regex", description="1 when the completion matches params.pattern")
def regex(completion: str, task: Any, *, pattern: str = "", **params: Any) -> RewardResult:
    ok = re.search(pattern, completion, flags=re.DOTALL) is not None
    return RewardResult(float(ok), {"regex": float(ok)})


@register("length_penalty", description="-(excess characters / max_chars) past max_chars, else 0")
def length_penalty(completion: str, task: Any, *, max_chars: int = 512, **params: Any) -> RewardResult:
    excess = max(0, len(completion) - max_chars)
    value = -excess / max(1, max_chars)
    return RewardResult(value, {"length_penalty": value})
