"""A ranking: a whole group ordered best first; each member folds its normalised Borda score,
and every ordered pair of the ranking is a preference."""

from __future__ import annotations

from argparse import ArgumentParser
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeGuard

from django.db import transaction
from pydantic import Field, model_validator

from apps.buffer.models import Experience

from apps.feedback.kinds import (
    ExperienceId,
    FeedbackKind,
    KindApiIn,
    KindValue,
    PageForm,
    Who,
    kind_register,
    kind_service,
    preference_pair,
)
from apps.feedback.models import Assignment, Feedback
from apps.feedback.kinds import submit
from apps.feedback.kinds.fold import group_members_locked
from apps.feedback.kinds.submit import ApiKeyRow
from apps.rewards.pairs import PreferencePair
from kernel.fold import Vote, borda_scores
from kernel.exceptions import InvalidInput
from kernel.jsontypes import Body

if TYPE_CHECKING:
    from apps.feedback.models import Person
    from apps.runs.models import Run


def _whole(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class RankingValue(KindValue):
    """{"order": [experience ids of the whole group, best first]}."""

    order: tuple[int, ...]

    def __post_init__(self) -> None:
        order = self.order
        if isinstance(order, (str, bytes)) or not order or not all(_whole(x) for x in order):
            raise InvalidInput("a ranking's order is a list of experience ids, best first", field="order")
        if len(set(order)) != len(order):
            raise InvalidInput("a ranking names each completion once", field="order")
        object.__setattr__(self, "order", tuple(order))

    def stored(self) -> Body:
        return {"order": list(self.order)}

    @classmethod
    def from_stored(cls, raw: Mapping[str, Any]) -> RankingValue:
        return cls(order=tuple(int(x) for x in raw["order"]))


class RankingIn(KindApiIn):
    """A ranking of a whole group, best first (no experience_id: the order names them)."""

    kind: Literal["ranking"]
    order: Annotated[list[ExperienceId], Field(min_length=1, max_length=256)] | None = Field(
        None, description="every experience id of one group, best first")

    @model_validator(mode="after")
    def _an_order(self) -> RankingIn:
        if not self.order:
            raise ValueError("ranking needs order")
        if self.experience_id is not None:
            raise ValueError("a ranking names its experiences in order, not experience_id")
        return self


@kind_service("ranking")
def feedback_rank(
    *, run: Run, order: Sequence[int], group_id: str | None = None, author: Person | None = None,
    api_key: ApiKeyRow | None = None, comment: str = "",
) -> Feedback:
    """A ranking of a whole group, best first. The group is the one the ranked
    experiences share (`group_id`, when given, must be it)."""
    value = RankingValue(order=order)  # type: ignore[arg-type]  # any sequence: checked in __post_init__
    comment, who = submit.comment_clean(comment), submit.person_of(author)
    with transaction.atomic():
        first = submit.experience_of_run(run=run, experience=value.order[0], what="order")
        if group_id is not None and str(group_id) != first.group_id:
            raise InvalidInput(f"experience {first.pk} is not in group {group_id!r}", field="order")
        members = group_members_locked(run=run, group_id=first.group_id)
        if sorted(value.order) != sorted(m.pk for m in members):
            raise InvalidInput(
                f"a ranking orders every completion of the group exactly once ({len(members)} in group)", field="order")
        fb = submit.feedback_row_create(run=run, kind="ranking", value=value, targets=members, group_id=first.group_id,
                                        author=who, api_key=api_key, comment=comment)
        return submit.feedback_fold_and_finish(run=run, feedback=fb, members=members, targets=value.order)


@kind_register
class Ranking(FeedbackKind):
    name = "ranking"
    Value = RankingValue
    target = "group"
    trained_key = "order"  # every member of the group it ranked
    folds = True
    labels = True
    agreement = "preference"  # every ordered pair of its ranking
    revisable = True
    revision_template = "feedback/revise/_ranking.html"
    ApiIn = RankingIn
    cli = True
    cli_help = "a whole group ordered best first"
    panel_template = "feedback/_rank.html"
    panel_slug = "rank"
    panel_link = "Rank group"
    panel_order = 2
    panel_key = "r"

    def _order(self, fb: Feedback) -> tuple[int, ...]:
        value = self.parse(fb.value)
        assert isinstance(value, RankingValue)
        return value.order

    def targets(self, fb: Feedback) -> list[int]:
        return list(self._order(fb))

    def votes(self, fb: Feedback) -> Iterable[Vote]:
        for pk, score in borda_scores(list(self._order(fb))).items():
            yield (pk, score, False)

    def preferred(self, fb: Feedback) -> list[tuple[int, int]]:
        order = self._order(fb)
        return [(better, worse) for i, better in enumerate(order) for worse in order[i + 1:]]

    def pairs(self, fb: Feedback, exps: Mapping[int, Experience], *, trust: float) -> list[PreferencePair]:
        order = [exps.get(x) for x in self._order(fb)]
        present = [e for e in order if e is not None]
        if len(present) != len(order):
            return []
        return [preference_pair(better, worse, kind=self.name, margin=1.0, group_id=fb.group_id, trust=trust)
                for i, better in enumerate(present) for worse in present[i + 1:]]

    def cli_store(self, opts: Mapping[str, Any], *, who: Who) -> Feedback:
        try:
            order = [int(x) for x in (opts["order"] or "").split(",") if x.strip()]
        except ValueError:
            raise InvalidInput("--order is experience ids separated by commas, best first") from None
        return self.store(order=order, **who)

    def cli_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--order", help="every experience id of one group, best first, comma-separated")

    def api_store(self, payload: KindApiIn, *, experience: int, who: Who) -> Feedback:
        assert isinstance(payload, RankingIn)
        return self.store(order=payload.order or [], **who)

    def panel_context(self, *, run: Run, experience: Experience, query: Mapping[str, str]) -> dict[str, object]:
        return {"members": group_members(experience)}

    def page_store(self, form: PageForm, *, experience: Experience, who: Who) -> Feedback:
        """The panel's form gives each member a place, `rank_<id>`: 1 (best) to the group's size."""
        members = group_members(experience)
        ranks: dict[int, int] = {}
        for m in members:
            raw = form.get(f"rank_{m.pk}", "")
            if not raw.strip().isdigit():
                raise InvalidInput(f"give completion #{m.pk} a rank from 1 to {len(members)}", field=f"rank_{m.pk}")
            ranks[m.pk] = int(raw)
        if sorted(ranks.values()) != list(range(1, len(members) + 1)):
            raise InvalidInput(f"ranks must be 1 to {len(members)}, each used once", field="rank")
        return self.store(group_id=experience.group_id, order=sorted(ranks, key=ranks.__getitem__), **who)

    def revision_values(self, fb: Feedback) -> dict[str, object]:
        # (experience id, its place, 1 = best), in id order: one number box a member
        return {"ranks": sorted((pk, place) for place, pk in enumerate(self._order(fb), start=1))}

    def page_saved(self, *, run: Run, feedback: Feedback) -> dict[str, object]:
        order = self._order(feedback)
        # The ranked items that were in this annotator's queue are done: their cards update too.
        closed = Assignment.objects.filter(run=run, annotator_id=feedback.author_id,
                                           experience_id__in=order).select_related("experience")
        return {"closed": closed,
                "message": f"Ranked {len(order)} completions"}


def group_members(e: Experience) -> list[Experience]:
    """The members of `e`'s group (no corrections), in id order: what a ranking orders."""
    return list(Experience.objects.filter(run_id=e.run_id, group_id=e.group_id, is_expert=False).order_by("id"))
