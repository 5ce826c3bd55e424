"""An environment's reward for one experience: it becomes the experience's automatic reward
(apps.feedback.services.feedback_env_reward). Not a human signal: it folds into no human
reward and yields no pair."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeGuard

from apps.feedback.kinds import FeedbackKind, FeedbackPayload, KindValue, Who, kind_register
from kernel.exceptions import InvalidInput
from kernel.jsontypes import Body

if TYPE_CHECKING:
    from apps.feedback.models import Feedback


def _finite(value: object) -> TypeGuard[int | float]:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


@dataclass(frozen=True)
class EnvRewardValue(KindValue):
    """{"reward": finite number, "reward_parts": {name: finite number}}; a row migrated from
    an unreadable number has reward None and the old value under `legacy`."""

    reward: float
    reward_parts: Mapping[str, float] = field(default_factory=dict)
    legacy: object = None

    def __post_init__(self) -> None:
        if not _finite(self.reward):
            raise InvalidInput("an environment reward is a finite number", field="value")
        parts = dict(self.reward_parts or {})
        for name, part in parts.items():
            if not isinstance(name, str) or not _finite(part):
                raise InvalidInput("reward_parts map names to finite numbers", field=f"reward_parts.{name}")
        object.__setattr__(self, "reward", float(self.reward))
        object.__setattr__(self, "reward_parts", {k: float(v) for k, v in parts.items()})

    @classmethod
    def from_stored(cls, raw: Mapping[str, Any]) -> EnvRewardValue:
        if raw.get("reward") is None:
            return cls._unchecked(reward=None, reward_parts=dict(raw.get("reward_parts") or {}),
                                  legacy=raw.get("legacy"))
        return cls(reward=raw["reward"], reward_parts=raw.get("reward_parts") or {}, legacy=raw.get("legacy"))

    def stored(self) -> Body:
        value: Body = {"reward": self.reward, "reward_parts": dict(self.reward_parts)}
        if self.reward is None or self.legacy is not None:
            value["legacy"] = self.legacy
        return value


@kind_register
class EnvReward(FeedbackKind):
    name = "env_reward"
    # An environment's reward is its automatic reward, not a person's label: not reviewed.
    reviewable = False
    nouns = ("environment reward", "environment rewards")
    Value = EnvRewardValue
    target = "experience"
    api = True

    def api_check(self, payload: FeedbackPayload) -> None:
        if payload.value is None:
            raise ValueError("env_reward needs a value")

    def api_store(self, payload: FeedbackPayload, *, experience: int, who: Who) -> Feedback:
        return self.store(experience=experience, reward=payload.value, reward_parts=payload.reward_parts,
                                   **who)
