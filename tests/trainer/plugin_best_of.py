"""A feedback kind that states preferences, as a plugin module: one file, loaded by RFT_PLUGINS.

"best_of": a rater names the best completion of its group, which is preferred over every
other member. This file is all of it: its value, its service, its body on the environment API
and its declaration, which says what the rest of the loop reads of it: its labels reach the
policy's training as preference pairs (`reaches`), they count toward the raters' pair agreement
(`agreement`), and `preferred` and `pairs` state the pairs. Importing it registers it (the
decorators), as a built-in kind's module registers itself. tests/trainer/test_preference_plugins.py
loads it with an algorithm plugin that trains on preference pairs (plugin_slic.py) and follows
its labels to the raters' agreement, the reward model's pairs, the algorithm's batches, the
exports and the Python client, with no other file edited."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from django.db import transaction

from apps.feedback.kinds import FeedbackKind, KindApiIn, KindValue, Who, kind_register, kind_service, preference_pair
from apps.feedback.kinds import submit
from apps.feedback.kinds.fold import group_members_locked
from apps.rewards.pairs import PreferencePair
from kernel.exceptions import InvalidInput

if TYPE_CHECKING:
    from apps.buffer.models import Experience
    from apps.feedback.models import Feedback, Person
    from apps.feedback.kinds.submit import ApiKeyRow
    from apps.runs.models import Run

NAME = "best_of"


@dataclass(frozen=True)
class BestOfValue(KindValue):
    """{"over": [the ids of the group's other members, which the row's experience beat]}."""

    over: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.over:
            raise InvalidInput("a best-of is chosen over at least one other completion", field="experience_id")
        object.__setattr__(self, "over", tuple(int(i) for i in self.over))


class BestOfIn(KindApiIn):
    """The best completion of its group (`experience_id`): preferred over every other member."""

    kind: Literal["best_of"]


@kind_service(NAME)
def feedback_best_of(*, run: Run, experience: Experience | int | None, author: Person | None = None,
                     api_key: ApiKeyRow | None = None, comment: str = "") -> Feedback:
    comment, who = submit.comment_clean(comment), submit.person_of(author)
    with transaction.atomic():
        best = submit.experience_of_run(run=run, experience=experience, what="experience_id")
        others = [m for m in group_members_locked(run=run, group_id=best.group_id) if m.pk != best.pk]
        fb = submit.feedback_row_create(run=run, kind=NAME, value=BestOfValue(over=tuple(m.pk for m in others)),
                                        targets=[best, *others], group_id=best.group_id, author=who,
                                        api_key=api_key, comment=comment)
        submit.feedback_announce(run=run, feedback=fb, ready=False)
    return fb


@kind_register
class BestOf(FeedbackKind):
    name = NAME
    Value = BestOfValue
    target = "experience"
    labels = True
    reaches = "preference"
    agreement = "preference"
    ApiIn = BestOfIn

    def _over(self, fb: Feedback) -> tuple[int, ...]:
        value = self.parse(fb.value)
        assert isinstance(value, BestOfValue)
        return value.over

    def targets(self, fb: Feedback) -> list[int]:
        return [i for i in (fb.experience_id, *self._over(fb)) if i]

    def preferred(self, fb: Feedback) -> list[tuple[int, int]]:
        best = fb.experience_id
        return [(best, other) for other in self._over(fb)] if best is not None else []

    def pairs(self, fb: Feedback, exps: Mapping[int, Experience], *, trust: float) -> list[PreferencePair]:
        best = exps.get(fb.experience_id) if fb.experience_id is not None else None
        others = [exps.get(i) for i in self._over(fb)]
        if best is None:
            return []
        return [preference_pair(best, other, kind=NAME, margin=1.0, group_id=best.group_id, trust=trust)
                for other in others if other is not None]

    def api_store(self, payload: KindApiIn, *, experience: int, who: Who) -> Feedback:
        return self.store(experience=experience, **who)
