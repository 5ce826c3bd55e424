"""A comparison: two completions of one group, winner "a" (the row's experience), "b" (its
other) or "tie". It moves no reward; the winner over the loser is a preference."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from apps.feedback.kinds import FeedbackKind, FeedbackPayload, KindValue, Who, kind_register, preference_pair
from apps.rewards.pairs import PreferencePair
from kernel.exceptions import InvalidInput

if TYPE_CHECKING:
    from apps.buffer.models import Experience
    from apps.feedback.models import Feedback

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


@kind_register
class Pairwise(FeedbackKind):
    name = "pairwise"
    nouns = ("A/B choice", "A/B choices")
    Value = PairwiseValue
    target = "pair"
    # DPO trains on the pair (apps.feedback.selectors.preferences_among); it folds into no reward.
    reaches = "preference"
    labels = True
    revisable = True
    api = True
    cli = True
    api_exclusive = ("other_experience_id", "winner", "preferred")
    api_exclusive_message = "other_experience_id and winner are for pairwise feedback only"

    def pairs(self, fb: Feedback, exps: Mapping[int, Experience], *, trust: float) -> list[PreferencePair]:
        a = exps.get(fb.experience_id) if fb.experience_id is not None else None
        b = exps.get(fb.other_id) if fb.other_id is not None else None
        value = self.parse(fb.value)
        assert isinstance(value, PairwiseValue)
        if a is None or b is None or not value.decided:
            return []
        chosen, rejected = (a, b) if value.winner == "a" else (b, a)
        return [preference_pair(chosen, rejected, kind=self.name, margin=1.0, group_id=a.group_id, trust=trust)]

    def cli_store(self, opts: Mapping[str, Any], *, who: Who) -> Feedback:
        return self.store(experience=opts["experience"], other=opts["other"], winner=opts["winner"] or "", **who)

    def api_check(self, payload: FeedbackPayload) -> None:
        if payload.winner is None:
            payload.winner = payload.preferred
        elif payload.preferred is not None and payload.preferred != payload.winner:
            raise ValueError("winner and preferred disagree")
        if payload.other_experience_id is None or payload.winner is None:
            raise ValueError("pairwise needs other_experience_id and winner")

    def api_store(self, payload: FeedbackPayload, *, experience: int, who: Who) -> Feedback:
        return self.store(experience=experience, other=payload.other_experience_id,
                                winner=payload.winner or "", **who)
