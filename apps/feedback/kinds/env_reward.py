"""An environment's reward for one experience: it becomes the experience's automatic reward
(`feedback_env_reward`). Not a human vote: it folds into no human
reward and yields no pair."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeGuard

from django.db import transaction
from pydantic import Field, FiniteFloat, model_validator

from apps.buffer.models import Experience

from apps.feedback.kinds import FeedbackKind, KindApiIn, KindValue, Who, kind_register, kind_service
from apps.feedback.kinds import submit
from apps.feedback.kinds.fold import group_fold, group_members_locked
from apps.feedback.kinds.submit import ApiKeyRow
from kernel.exceptions import InvalidInput
from kernel.jsontypes import Body

if TYPE_CHECKING:
    from apps.feedback.models import Feedback, Person
    from apps.runs.models import Run

PartName = Annotated[str, Field(min_length=1, max_length=100)]


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


class EnvRewardIn(KindApiIn):
    """An environment's reward for one experience (its automatic reward)."""

    kind: Literal["env_reward"]
    value: FiniteFloat | None = Field(None, description="the reward")
    reward_parts: Annotated[dict[PartName, FiniteFloat], Field(max_length=64)] = Field(
        default_factory=dict, description="named parts, merged into the experience's")

    @model_validator(mode="after")
    def _a_reward(self) -> EnvRewardIn:
        if self.value is None:
            raise ValueError("env_reward needs a value")
        return self


@kind_service("env_reward")
def feedback_env_reward(
    *, run: Run, experience: Experience | int | None, reward: float, reward_parts: Mapping[str, float] | None = None,
    author: Person | None = None, api_key: ApiKeyRow | None = None, comment: str = "",
) -> Feedback:
    """An environment's reward for one experience: it becomes the experience's automatic
    reward (its parts merged into reward_parts), and the fold recomputes the training
    reward (auto: the reward itself, making a pending experience ready; blend: combined
    with the human fold). Late: stored, reward unchanged under the trainer's feet."""
    value = EnvRewardValue(reward=reward, reward_parts=reward_parts or {})
    comment, who = submit.comment_clean(comment), submit.person_of(author)
    with transaction.atomic():
        target = submit.experience_of_run(run=run, experience=experience, what="experience_id")
        members = group_members_locked(run=run, group_id=target.group_id) if not target.is_expert else []
        locked = next((m for m in members if m.pk == target.pk), None) or \
            Experience.objects.select_for_update().get(pk=target.pk)
        fb = submit.feedback_row_create(run=run, kind="env_reward", value=value, targets=[locked],
                                        group_id=locked.group_id, author=who, api_key=api_key, comment=comment)
        ready = False
        if not fb.late:
            locked.auto_reward = value.reward
            locked.reward_parts = {**(locked.reward_parts or {}), **value.reward_parts}
            update = ["auto_reward", "reward_parts"]
            if run.cfg.feedback.mode == "auto":
                locked.reward = value.reward
                update.append("reward")
                if locked.status == Experience.Status.PENDING:
                    locked.status = Experience.Status.READY
                    update.append("status")
                    ready = True
            locked.save(update_fields=update)
            if run.cfg.feedback.mode != "auto" and members:
                ready = group_fold(run=run, group_id=locked.group_id, members=members).became_ready
        submit.feedback_announce(run=run, feedback=fb, ready=ready)
    return fb


@kind_register
class EnvReward(FeedbackKind):
    name = "env_reward"
    # An environment's reward is its automatic reward, not a person's label: not reviewed.
    reviewable = False
    nouns = ("environment reward", "environment rewards")
    Value = EnvRewardValue
    target = "experience"
    ApiIn = EnvRewardIn

    def api_store(self, payload: KindApiIn, *, experience: int, who: Who) -> Feedback:
        assert isinstance(payload, EnvRewardIn)
        return self.store(experience=experience, reward=payload.value, reward_parts=payload.reward_parts, **who)
