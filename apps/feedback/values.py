"""The one stored `value` shape of each kind of feedback, built and checked in one place.

Every door (annotation page, environment API, CLI, tests) goes through these builders via
the services in `apps.feedback.services`, so a value is stored in exactly one shape per
kind (documented on `apps.feedback.models.Feedback`) and every reader (the policy fold,
the trainer's DPO pairs, the exports) reads that shape only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from apps.runs.feedback_policy import rating_normalise
from rftweb.exceptions import InvalidInput

FLAGS: tuple[str, ...] = ("unsafe", "broken", "off_task")
WINNERS: tuple[str, ...] = ("a", "b", "tie")
Winner = Literal["a", "b", "tie"]
REASON_MAX = 5000


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def rating_value(*, score: int | None = None, thumb: str | None = None) -> dict[str, Any]:
    """{"score": 1..5 | None, "thumb": "up" | "down" | None, "normalised": [0, 1]}."""
    if (score is None) == (thumb is None):
        raise InvalidInput("a rating has either a score (1-5) or a thumb (up/down)", field="score")
    try:
        normalised = rating_normalise(score=score, thumb=thumb)
    except ValueError as exc:
        raise InvalidInput(str(exc), field="thumb" if thumb is not None else "score") from None
    return {"score": score, "thumb": thumb, "normalised": normalised}


def flag_value(*, flags: Sequence[str] = (), reason: str = "") -> dict[str, Any]:
    """{"flags": sorted subset of FLAGS, "reason": str}; at least one of the two given."""
    if isinstance(flags, str) or not all(isinstance(f, str) for f in flags) or not set(flags) <= set(FLAGS):
        raise InvalidInput(f"flags are a list of {', '.join(FLAGS)}", field="flags")
    reason = (reason or "").strip()
    if len(reason) > REASON_MAX:
        raise InvalidInput(f"a reason is at most {REASON_MAX} characters", field="reason")
    if not flags and not reason:
        raise InvalidInput(f"a flag names one of {', '.join(FLAGS)} or gives a reason", field="flags")
    return {"flags": sorted(set(flags)), "reason": reason}


def pairwise_value(*, winner: str) -> dict[str, Any]:
    """{"winner": "a" | "b" | "tie"}: a is the feedback's `experience`, b its `other`."""
    if winner not in WINNERS:
        raise InvalidInput("a comparison's winner is 'a', 'b' or 'tie'", field="winner")
    return {"winner": winner}


def ranking_value(*, order: Sequence[int]) -> dict[str, Any]:
    """{"order": [experience ids of the whole group, best first]}."""
    if isinstance(order, (str, bytes)) or not order or not all(_whole(x) for x in order):
        raise InvalidInput("a ranking's order is a list of experience ids, best first", field="order")
    if len(set(order)) != len(order):
        raise InvalidInput("a ranking names each completion once", field="order")
    return {"order": list(order)}


def env_reward_value(*, reward: float, reward_parts: Mapping[str, float] | None = None) -> dict[str, Any]:
    """{"reward": finite number, "reward_parts": {name: finite number}}."""
    if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
        raise InvalidInput("an environment reward is a finite number", field="value")
    parts = dict(reward_parts or {})
    for name, part in parts.items():
        if not isinstance(name, str) or isinstance(part, bool) or not isinstance(part, (int, float)) \
                or not math.isfinite(part):
            raise InvalidInput("reward_parts map names to finite numbers", field=f"reward_parts.{name}")
    return {"reward": float(reward), "reward_parts": {k: float(v) for k, v in parts.items()}}


def edit_value(*, expert_id: int) -> dict[str, Any]:
    """{"expert_id": the expert experience holding the corrected completion}."""
    return {"expert_id": int(expert_id)}
