"""An edit: a corrected completion, written as an expert experience
(apps.feedback.services.feedback_edit); the correction over the original is a preference."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from apps.feedback.kinds import FeedbackKind, KindValue, Who, kind_register, preference_pair
from apps.rewards.pairs import PreferencePair
from kernel.exceptions import InvalidInput

if TYPE_CHECKING:
    from apps.buffer.models import Experience
    from apps.feedback.models import Feedback


# Why a correction's expert experience is filtered when its edit is rejected on the review page.
REJECTED_REASON = "review: the correction was rejected"


@dataclass(frozen=True)
class EditValue(KindValue):
    """{"expert_id": the expert experience holding the corrected completion}."""

    expert_id: int

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "expert_id", int(self.expert_id))
        except (TypeError, ValueError):
            raise InvalidInput("an edit names its expert experience by id", field="expert_id") from None


@kind_register
class Edit(FeedbackKind):
    name = "edit"
    nouns = ("correction", "corrections")
    Value = EditValue
    target = "experience"
    labels = True
    cli = True
    reaches = "expert"

    def cli_store(self, opts: Mapping[str, Any], *, who: Who) -> Feedback:
        feedback: Feedback
        feedback, _ = self.service(experience=opts["experience"], text=opts["text"] or "", **who)
        return feedback

    def reviewed(self, fb: Feedback, *, rejected: bool) -> str:
        """A rejected correction leaves the buffer (filtered, so neither SFT, MIX nor the exports
        take it) unless a trainer already took it; accepted again, it comes back."""
        from apps.buffer.models import Experience

        value = self.parse(fb.value)
        assert isinstance(value, EditValue)
        expert = Experience.objects.filter(pk=value.expert_id)
        if rejected:
            if expert.filter(status=Experience.Status.READY).update(status=Experience.Status.FILTERED,
                                                                    filter_reason=REJECTED_REASON):
                return "its corrected completion is filtered out of training"
            if expert.filter(status__in=(Experience.Status.LEASED, Experience.Status.CONSUMED)).exists():
                return "its corrected completion was already trained on"
            return ""
        if expert.filter(status=Experience.Status.FILTERED, filter_reason=REJECTED_REASON).update(
                status=Experience.Status.READY, filter_reason=""):
            return "its corrected completion is trainable again"
        return ""

    def trained_ids(self, fb: Feedback) -> list[int]:
        # What trains is the corrected completion, never the original.
        value = self.parse(fb.value)
        assert isinstance(value, EditValue)
        return [value.expert_id]

    def pair_ids(self, fb: Feedback) -> list[int]:
        value = self.parse(fb.value)
        assert isinstance(value, EditValue)
        return [i for i in (fb.experience_id, value.expert_id) if i]

    def pairs(self, fb: Feedback, exps: Mapping[int, Experience], *, trust: float) -> list[PreferencePair]:
        value = self.parse(fb.value)
        assert isinstance(value, EditValue)
        original = exps.get(fb.experience_id) if fb.experience_id is not None else None
        expert = exps.get(value.expert_id)
        if original is None or expert is None or expert.response_text == original.response_text:
            return []
        return [preference_pair(expert, original, kind=self.name, margin=1.0, group_id=original.group_id,
                                trust=trust)]
