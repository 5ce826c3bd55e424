"""An edit: a corrected completion, written as an expert experience
(`feedback_edit`); the correction over the original is a preference."""

from __future__ import annotations

import hashlib
from argparse import ArgumentParser
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.db import transaction

from apps.buffer.drafts import ExperienceDraft
from apps.buffer.models import Experience
from apps.buffer.services import experience_write
from apps.feedback.kinds import FeedbackKind, KindValue, PageForm, Who, kind_register, kind_service, preference_pair
from apps.feedback.ledger import correction_saved_words
from apps.feedback.models import Feedback
from apps.feedback.kinds import submit
from apps.rewards.pairs import PreferencePair
from apps.runs.selectors import run_takes_feedback
from kernel.exceptions import InvalidInput

if TYPE_CHECKING:
    from apps.feedback.models import Person
    from apps.runs.models import Run


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


@kind_service("edit")
def feedback_edit(*, run: Run, author: Person | None, experience: Experience | int, text: str, comment: str = "") -> tuple[Feedback, Experience]:
    """A corrected completion: written through experience_write as an expert experience
    (is_expert, parent = the original, source human) and recorded as edit feedback.

    The key is stable in (original, author, text), so a resubmitted form writes nothing
    twice while a revised correction is a new expert experience. Token ids are left empty:
    the web side has no tokenizer; the trainer tokenises prompt_text + response_text.
    """
    if not run_takes_feedback(run=run):
        raise submit.FeedbackClosed(run)  # before the expert row is written
    text = (text or "").replace("\r\n", "\n")
    if not text.strip():
        raise InvalidInput("a correction needs some text", field="text")
    if len(text) > 100_000:
        raise InvalidInput("a correction is at most 100000 characters", field="text")
    comment, who = submit.comment_clean(comment), submit.person_of(author)
    with transaction.atomic():
        parent = submit.experience_of_run(run=run, experience=experience, what="experience_id")
        if parent.is_expert:
            raise InvalidInput("edit the original completion, not a correction", field="experience_id")
        digest = hashlib.sha256(text.encode()).hexdigest()[:16]
        key = f"edit:{parent.pk}:{who.pk if who else 'anon'}:{digest}"
        result = experience_write(experiences=[ExperienceDraft(
            run_id=run.pk,
            key=key,
            group_id=f"expert-{parent.pk}",
            task_id=parent.task_id,
            source=Experience.Source.HUMAN,
            prompt_text=parent.prompt_text,
            response_text=text,
            is_expert=True,
            parent_id=parent.pk,
            status=Experience.Status.READY,
            # A correction is the annotator's best answer: the top of the human scale.
            human_reward=1.0,
            reward=1.0,
            model_version=parent.model_version,
            metadata={"edit_of": parent.pk, "author": who.get_username() if who else None},
        )], announce=True)
        expert = Experience.objects.get(pk=result.ids[0])
        value = EditValue(expert_id=expert.pk)
        fb = Feedback.objects.filter(run=run, kind="edit", experience=parent, value__expert_id=expert.pk).first()
        if fb is None:
            fb = submit.feedback_row_create(run=run, kind="edit", value=value, targets=[parent],
                                            group_id=parent.group_id, author=who, api_key=None, comment=comment)
            submit.feedback_announce(run=run, feedback=fb, ready=False)
    return fb, expert


@kind_register
class Edit(FeedbackKind):
    name = "edit"
    nouns = ("correction", "corrections")
    Value = EditValue
    target = "experience"
    labels = True
    cli = True
    cli_help = "a corrected completion, written as an expert experience"
    reaches = "expert"
    late_note = False  # a correction is never late: it writes a new expert experience
    # What trains is the corrected completion (its value's expert_id), never the original.
    trained_key = "expert_id"
    panel_template = "feedback/_edit.html"
    panel_link = "Edit"
    panel_order = 1
    panel_key = "e"
    page_mark = "corrected"

    def cli_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--experience", type=int, help="the experience corrected")
        parser.add_argument("--text", help="the corrected completion")

    def cli_store(self, opts: Mapping[str, Any], *, who: Who) -> Feedback:
        feedback: Feedback
        feedback, _ = self.service(experience=opts["experience"], text=opts["text"] or "", **who)
        return feedback

    def panel_context(self, *, run: Run, experience: Experience, query: Mapping[str, str]) -> dict[str, object]:
        return {"text": experience.response_text}

    def page_store(self, form: PageForm, *, experience: Experience, who: Who) -> Feedback:
        feedback: Feedback
        feedback, _ = self.service(experience=experience, text=form.get("text", ""), **who)
        return feedback

    def page_saved(self, *, run: Run, feedback: Feedback) -> dict[str, object]:
        value = self.parse(feedback.value)
        assert isinstance(value, EditValue)
        expert = Experience.objects.get(pk=value.expert_id)
        return {"message": correction_saved_words(run=run, expert=expert), "expert": expert}

    def reviewed(self, fb: Feedback, *, rejected: bool) -> str:
        """A rejected correction leaves the buffer (filtered, so neither SFT, MIX nor the exports
        take it) unless a trainer already took it; accepted again, it comes back."""
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
