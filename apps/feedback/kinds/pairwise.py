"""A comparison: two completions of one group, winner "a" (the row's experience), "b" (its
other) or "tie". It moves no reward; the winner over the loser is a preference."""

from __future__ import annotations

from argparse import ArgumentParser
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from django.db import transaction
from pydantic import Field, model_validator

from apps.feedback.kinds import (
    ExperienceId,
    FeedbackKind,
    KindApiIn,
    KindValue,
    PageForm,
    Who,
    Winner,
    kind_register,
    kind_service,
    preference_pair,
)
from apps.feedback.kinds.ranking import group_members
from apps.feedback.models import Feedback
from apps.feedback.kinds import submit
from apps.feedback.kinds.submit import ApiKeyRow
from apps.rewards.pairs import PreferencePair
from kernel.exceptions import InvalidInput

if TYPE_CHECKING:
    from apps.buffer.models import Experience
    from apps.feedback.models import Person
    from apps.runs.models import Run

WINNERS: tuple[str, ...] = ("a", "b", "tie")


@dataclass(frozen=True)
class PairwiseValue(KindValue):
    """{"winner": "a" | "b" | "tie"}; a row migrated from a choice naming no side is a tie
    with the old value under `legacy`."""

    winner: str
    legacy: object = None

    def __post_init__(self) -> None:
        if self.winner not in WINNERS:
            raise InvalidInput("a comparison's winner is 'a', 'b' or 'tie'", field="winner")

    @property
    def decided(self) -> bool:
        """A side won (a tie says no preference)."""
        return self.winner in ("a", "b")


class PairwiseIn(KindApiIn):
    """A choice between two completions of one group: `experience_id` is A, the other B."""

    kind: Literal["pairwise"]
    other_experience_id: ExperienceId | None = Field(None, description="the second experience (B)")
    winner: Winner | None = Field(None, description="which one is better")
    preferred: Winner | None = Field(None, description="the same as `winner` (older name)")

    @model_validator(mode="after")
    def _two_and_a_winner(self) -> PairwiseIn:
        if self.winner is None:
            self.winner = self.preferred
        elif self.preferred is not None and self.preferred != self.winner:
            raise ValueError("winner and preferred disagree")
        if self.other_experience_id is None or self.winner is None:
            raise ValueError("pairwise needs other_experience_id and winner")
        return self


@kind_service("pairwise")
def feedback_compare(
    *, run: Run, experience: Experience | int | None, other: Experience | int | None, winner: str,
    author: Person | None = None, api_key: ApiKeyRow | None = None, comment: str = "",
) -> Feedback:
    """A choice between two completions of one group: winner "a" (`experience`), "b"
    (`other`) or "tie". Stored for DPO (trainer and export); it moves no reward."""
    value = PairwiseValue(winner=winner)
    comment, who = submit.comment_clean(comment), submit.person_of(author)
    with transaction.atomic():
        a = submit.experience_of_run(run=run, experience=experience, what="experience_id")
        b = submit.experience_of_run(run=run, experience=other, what="other_experience_id")
        if a.pk == b.pk:
            raise InvalidInput("a comparison needs two different completions", field="other_experience_id")
        if a.group_id != b.group_id:
            raise InvalidInput("a comparison is between completions of one prompt (one group)",
                               field="other_experience_id")
        fb = submit.feedback_row_create(run=run, kind="pairwise", value=value, targets=[a, b], group_id=a.group_id,
                                        author=who, api_key=api_key, comment=comment, other=b)
        submit.feedback_announce(run=run, feedback=fb, ready=False)
    return fb


@kind_register
class Pairwise(FeedbackKind):
    name = "pairwise"
    nouns = ("A/B choice", "A/B choices")
    Value = PairwiseValue
    target = "pair"
    # DPO trains on the pair (apps.feedback.selectors.preferences_among); it folds into no reward.
    reaches = "preference"
    agreement = "preference"
    labels = True
    revisable = True
    revision_template = "feedback/revise/_pairwise.html"
    ApiIn = PairwiseIn
    cli = True
    cli_help = "a choice between two completions of one group"
    panel_template = "feedback/_compare.html"
    panel_slug = "compare"
    panel_link = "Compare A/B"
    panel_order = 3
    panel_key = "c"
    page_mark = "compared"

    def pairs(self, fb: Feedback, exps: Mapping[int, Experience], *, trust: float) -> list[PreferencePair]:
        a = exps.get(fb.experience_id) if fb.experience_id is not None else None
        b = exps.get(fb.other_id) if fb.other_id is not None else None
        value = self.parse(fb.value)
        assert isinstance(value, PairwiseValue)
        if a is None or b is None or not value.decided:
            return []
        chosen, rejected = (a, b) if value.winner == "a" else (b, a)
        return [preference_pair(chosen, rejected, kind=self.name, margin=1.0, group_id=a.group_id, trust=trust)]

    def preferred(self, fb: Feedback) -> list[tuple[int, int]]:
        value = self.parse(fb.value)
        assert isinstance(value, PairwiseValue)
        a, b = fb.experience_id, fb.other_id
        if a is None or b is None or not value.decided:
            return []
        return [(a, b) if value.winner == "a" else (b, a)]

    def cli_store(self, opts: Mapping[str, Any], *, who: Who) -> Feedback:
        return self.store(experience=opts["experience"], other=opts["other"], winner=opts["winner"] or "", **who)

    def cli_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--experience", type=int, help="the first experience (A)")
        parser.add_argument("--other", type=int, help="the second experience (B)")
        parser.add_argument("--winner", choices=WINNERS, help="which one is better")

    def api_store(self, payload: KindApiIn, *, experience: int, who: Who) -> Feedback:
        assert isinstance(payload, PairwiseIn)
        return self.store(experience=experience, other=payload.other_experience_id, winner=payload.winner or "", **who)

    def panel_context(self, *, run: Run, experience: Experience, query: Mapping[str, str]) -> dict[str, object]:
        """A against the sibling the query names (`other`), else the first."""
        siblings = [m for m in group_members(experience) if m.pk != experience.pk]
        other_id = query.get("other", "")
        other = next((m for m in siblings if str(m.pk) == other_id), siblings[0] if siblings else None)
        return {"other": other, "siblings": siblings}

    def page_store(self, form: PageForm, *, experience: Experience, who: Who) -> Feedback:
        other_raw = form.get("other", "")
        if not other_raw.isdigit():
            raise InvalidInput("choose the completion to compare with", field="other")
        return self.store(experience=experience, other=int(other_raw), winner=form.get("winner", ""), **who)

    def revision_values(self, fb: Feedback) -> dict[str, object]:
        value = fb.value if isinstance(fb.value, dict) else {}
        return {"winner": str(value.get("winner") or ""), "other": fb.other_id, "experience": fb.experience_id}

    def page_saved(self, *, run: Run, feedback: Feedback) -> dict[str, object]:
        value = self.parse(feedback.value)
        assert isinstance(value, PairwiseValue)
        said = {"a": "A is better", "b": "B is better"}.get(str(value.winner).lower(), "a tie")
        return {"message": f"Preference saved: {said}"}
