"""A rating: one completion scored 1..5 or given a thumb; folds as its normalised score, and
the group's rated members yield pairs by their folded human rewards."""

from __future__ import annotations

from argparse import ArgumentParser
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field, FiniteFloat, model_validator

from apps.feedback.kinds import FeedbackKind, KindApiIn, KindValue, PageForm, Who, kind_register, kind_service
from apps.feedback.kinds.submit import ApiKeyRow, feedback_store
from kernel.fold import Vote, rating_normalise
from kernel.exceptions import InvalidInput
from kernel.jsontypes import Body

if TYPE_CHECKING:
    from apps.buffer.models import Experience
    from apps.feedback.models import Feedback, Person
    from apps.runs.models import Run


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


class RatingIn(KindApiIn):
    """A rating of one completion: a score from 1 to 5, or a thumb."""

    kind: Literal["rating"]
    value: FiniteFloat | None = Field(None, description="the score 1-5 (the same as `score`)")
    score: Annotated[int, Field(ge=1, le=5)] | None = Field(None, description="1 (worst) to 5 (best)")
    thumb: Literal["up", "down"] | None = Field(None, description="instead of a score")

    @model_validator(mode="after")
    def _score_or_thumb(self) -> RatingIn:
        if self.value is not None:
            if self.score is not None or not float(self.value).is_integer() or not 1 <= self.value <= 5:
                raise ValueError("a rating's value is its score, a whole number from 1 to 5")
            self.score, self.value = int(self.value), None
        if (self.score is None) == (self.thumb is None):
            raise ValueError("rating needs a score (1-5) or a thumb (up/down)")
        return self


@kind_service("rating")
def feedback_rate(
    *, run: Run, experience: Experience | int | None, score: int | None = None, thumb: str | None = None,
    author: Person | None = None, api_key: ApiKeyRow | None = None, comment: str = "",
) -> Feedback:
    """A rating of one completion: a score 1..5 or a thumb; folded into its group's
    rewards (unless late) and closing the author's assignment of it."""
    return feedback_store(run=run, kind="rating", value=RatingValue(score=score, thumb=thumb), experience=experience,
                          author=author, api_key=api_key, comment=comment)


def score_from_form(form: PageForm) -> tuple[int | None, str | None]:
    """(score, thumb) from a rating form's `score` and `thumb` fields (either may be empty);
    InvalidInput names `score` when it is not a whole number."""
    raw, thumb = form.get("score", ""), form.get("thumb", "") or None
    if raw == "":
        return None, thumb
    try:
        return int(raw), thumb
    except ValueError:
        raise InvalidInput(f"a rating is a whole number from 1 to 5, got {raw!r}", field="score") from None


@kind_register
class Rating(FeedbackKind):
    name = "rating"
    Value = RatingValue
    target = "experience"
    folds = True
    labels = True
    pairs_by_fold = True
    agreement = "rating"  # its score or thumb, between the raters of one item
    revisable = True
    revision_template = "feedback/revise/_rating.html"
    ApiIn = RatingIn
    cli = True
    cli_help = "a score from 1 to 5, or a thumb"
    # Given on the item's card itself (feedback/_item.html), not in a panel.

    def cli_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--experience", type=int, help="the experience")
        parser.add_argument("--score", type=int, help="1 (worst) to 5 (best)")
        parser.add_argument("--thumb", choices=("up", "down"), help="instead of a score")

    def cli_store(self, opts: Mapping[str, Any], *, who: Who) -> Feedback:
        return self.store(experience=opts["experience"], score=opts["score"], thumb=opts["thumb"], **who)

    def votes(self, fb: Feedback) -> Iterable[Vote]:
        value = self.parse(fb.value)
        assert isinstance(value, RatingValue)
        if value.normalised is not None and fb.experience_id is not None:
            yield (fb.experience_id, float(value.normalised), True)

    def api_store(self, payload: KindApiIn, *, experience: int, who: Who) -> Feedback:
        assert isinstance(payload, RatingIn)
        return self.store(experience=experience, score=payload.score, thumb=payload.thumb, **who)

    def revision_store(self, form: PageForm, *, experience: Experience, who: Who) -> Feedback:
        score, thumb = score_from_form(form)  # the card's rating fields
        return self.store(experience=experience, score=score, thumb=thumb, **who)

    def revision_values(self, fb: Feedback) -> dict[str, object]:
        value = fb.value if isinstance(fb.value, dict) else {}
        return {"score": value.get("score"), "thumb": value.get("thumb")}
