"""A rating: one completion scored 1..5 or given a thumb; folds as its normalised score, and
the group's rated members yield pairs by their folded human rewards."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from apps.feedback.kinds import FeedbackKind, FeedbackPayload, KindValue, Who, kind_register
from kernel.feedback_policy import Signal, rating_normalise
from kernel.exceptions import InvalidInput
from kernel.jsontypes import Body

if TYPE_CHECKING:
    from apps.feedback.models import Feedback


@dataclass(frozen=True)
class RatingValue(KindValue):
    """{"score": 1..5 | None, "thumb": "up" | "down" | None, "normalised": [0, 1] | None}:
    one of score and thumb. A row migrated from an old API number with no readable scale has
    neither, normalised None and the number under `legacy` (kept for people, never folded)."""

    score: int | None = None
    thumb: str | None = None
    normalised: float | None = None
    legacy: object = None

    def __post_init__(self) -> None:
        if (self.score is None) == (self.thumb is None):
            raise InvalidInput("a rating has either a score (1-5) or a thumb (up/down)", field="score")
        try:
            normalised = rating_normalise(score=self.score, thumb=self.thumb)
        except ValueError as exc:
            raise InvalidInput(str(exc), field="thumb" if self.thumb is not None else "score") from None
        object.__setattr__(self, "normalised", normalised)

    @classmethod
    def from_stored(cls, raw: Mapping[str, Any]) -> RatingValue:
        if raw.get("score") is None and raw.get("thumb") is None:
            return cls._unchecked(score=None, thumb=None, normalised=None, legacy=raw.get("legacy"))
        return cls(score=raw.get("score"), thumb=raw.get("thumb"), legacy=raw.get("legacy"))

    def stored(self) -> Body:
        value: Body = {"score": self.score, "thumb": self.thumb, "normalised": self.normalised}
        if self.score is None and self.thumb is None or self.legacy is not None:
            value["legacy"] = self.legacy
        return value


@kind_register
class Rating(FeedbackKind):
    name = "rating"
    Value = RatingValue
    target = "experience"
    folds = True
    labels = True
    pairs_by_fold = True
    revisable = True
    api = True
    cli = True

    def cli_store(self, opts: Mapping[str, Any], *, who: Who) -> Feedback:
        return self.store(experience=opts["experience"], score=opts["score"], thumb=opts["thumb"], **who)

    def signals(self, fb: Feedback) -> Iterable[Signal]:
        value = self.parse(fb.value)
        assert isinstance(value, RatingValue)
        if value.normalised is not None and fb.experience_id is not None:
            yield (fb.experience_id, float(value.normalised), True)

    def api_check(self, payload: FeedbackPayload) -> None:
        if payload.value is not None:
            if payload.score is not None or not float(payload.value).is_integer() or not 1 <= payload.value <= 5:
                raise ValueError("a rating's value is its score, a whole number from 1 to 5")
            payload.score, payload.value = int(payload.value), None
        if (payload.score is None) == (payload.thumb is None):
            raise ValueError("rating needs a score (1-5) or a thumb (up/down)")

    def api_store(self, payload: FeedbackPayload, *, experience: int, who: Who) -> Feedback:
        return self.store(experience=experience, score=payload.score, thumb=payload.thumb, **who)
