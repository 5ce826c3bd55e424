"""A ranking: a whole group ordered best first; each member folds its normalised Borda score,
and every ordered pair of the ranking is a preference."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeGuard

from apps.feedback.kinds import FeedbackKind, FeedbackPayload, KindValue, Who, kind_register, preference_pair
from apps.rewards.pairs import PreferencePair
from kernel.feedback_policy import Signal, borda_scores
from kernel.exceptions import InvalidInput
from kernel.jsontypes import Body

if TYPE_CHECKING:
    from apps.buffer.models import Experience
    from apps.feedback.models import Feedback


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


@kind_register
class Ranking(FeedbackKind):
    name = "ranking"
    Value = RankingValue
    target = "group"
    folds = True
    labels = True
    revisable = True
    api = True
    cli = True
    api_exclusive = ("order",)
    api_exclusive_message = "order is for ranking feedback only"

    def _order(self, fb: Feedback) -> tuple[int, ...]:
        value = self.parse(fb.value)
        assert isinstance(value, RankingValue)
        return value.order

    def targets(self, fb: Feedback) -> list[int]:
        return list(self._order(fb))

    def signals(self, fb: Feedback) -> Iterable[Signal]:
        for pk, score in borda_scores(list(self._order(fb))).items():
            yield (pk, score, False)

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

    def api_check(self, payload: FeedbackPayload) -> None:
        if not payload.order:
            raise ValueError("ranking needs order")
        if payload.experience_id is not None:
            raise ValueError("a ranking names its experiences in order, not experience_id")

    def api_store(self, payload: FeedbackPayload, *, experience: int, who: Who) -> Feedback:
        return self.store(order=payload.order or [], **who)
