"""Built-in rule rewards: exact match, regex, length penalty."""

from __future__ import annotations

import re
from collections.abc import Mapping

from apps.rewards.answers import answer_extract
from kernel.rewards import RewardResult, booleans_check, reference_text, register


def _normalise(text: str, *, case: bool) -> str:
    text = " ".join(text.split())
    return text if case else text.casefold()


@register("exact_match", check=booleans_check("exact_match", "case_sensitive", "use_answer_tag"),
          description="1 when the answer (tagged answer if present, else the completion) equals the reference")
def exact_match(
    completion: str, task: object, *, case_sensitive: bool = True, use_answer_tag: bool = True, **params: object
) -> RewardResult:
    # A model trained with <answer> tags should not lose the reward for wrapping its answer.
    tagged = answer_extract(completion) if use_answer_tag else None
    answer = completion if tagged is None else tagged
    ok = _normalise(answer, case=case_sensitive) == _normalise(reference_text(task), case=case_sensitive)
    return RewardResult(float(ok), {"exact_match": float(ok)})


def _regex_check(params: Mapping[str, object]) -> None:
    pattern = params.get("pattern")
    if not isinstance(pattern, str) or not pattern:
        raise ValueError("regex needs params.pattern, a non-empty regular expression")
    try:
        re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"regex: params.pattern {pattern!r} does not compile: {exc}") from None


@register("regex", check=_regex_check, description="1 when the completion matches params.pattern")
def regex(completion: str, task: object, *, pattern: str = "", fullmatch: bool = False, **params: object) -> RewardResult:
    compiled = re.compile(pattern, flags=re.DOTALL)
    ok = (compiled.fullmatch(completion.strip()) if fullmatch else compiled.search(completion)) is not None
    return RewardResult(float(ok), {"regex": float(ok)})


def _length_check(params: Mapping[str, object]) -> None:
    value = params.get("max_chars", 512)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"length_penalty: max_chars must be a positive integer, got {value!r}")


@register("length_penalty", check=_length_check,
          description="-(excess characters / max_chars) past max_chars, else 0; floored at -1")
def length_penalty(completion: str, task: object, *, max_chars: int = 512, **params: object) -> RewardResult:
    excess = max(0, len(completion) - max_chars)
    # Floored so one runaway completion cannot swamp every other term of the sum.
    value = max(-1.0, -excess / max(1, max_chars))
    return RewardResult(value, {"length_penalty": value})
