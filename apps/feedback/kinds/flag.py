"""A flag: one completion marked unsafe, broken or off task and/or a reason in words. It moves
no reward and yields no pair; the pipeline's flag filter drops flagged experiences."""

from __future__ import annotations

from argparse import ArgumentParser
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal

from django.db import transaction
from pydantic import Field

from apps.feedback.kinds import FeedbackKind, KindApiIn, KindValue, PageForm, Who, kind_register, kind_service
from apps.feedback.kinds import submit
from apps.feedback.handout.lease import assignments_finish
from apps.feedback.kinds.submit import ApiKeyRow
from kernel.exceptions import InvalidInput
from kernel.jsontypes import Body

if TYPE_CHECKING:
    from apps.buffer.models import Experience
    from apps.feedback.models import Feedback, Person
    from apps.runs.models import Run

FLAGS: tuple[str, ...] = ("unsafe", "broken", "off_task")
REASON_MAX = 5000
# What an older API client's flag without flags or reason reads as.
API_FLAG_REASON = "flagged through the environment API"


@dataclass(frozen=True)
class FlagValue(KindValue):
    """{"flags": sorted subset of FLAGS, "reason": str}; at least one of the two given."""

    flags: tuple[str, ...] = ()
    reason: str = ""

    def __post_init__(self) -> None:
        flags: Sequence[object] = self.flags
        if isinstance(flags, str) or not all(isinstance(f, str) for f in flags) or not set(flags) <= set(FLAGS):
            raise InvalidInput(f"flags are a list of {', '.join(FLAGS)}", field="flags")
        reason = (self.reason or "").strip()
        if len(reason) > REASON_MAX:
            raise InvalidInput(f"a reason is at most {REASON_MAX} characters", field="reason")
        if not flags and not reason:
            raise InvalidInput(f"a flag names one of {', '.join(FLAGS)} or gives a reason", field="flags")
        object.__setattr__(self, "flags", tuple(sorted(set(flags))))
        object.__setattr__(self, "reason", reason)

    def stored(self) -> Body:
        return {"flags": list(self.flags), "reason": self.reason}

    @classmethod
    def from_stored(cls, raw: Mapping[str, Any]) -> FlagValue:
        return cls(flags=tuple(raw.get("flags") or ()), reason=raw.get("reason") or "")


class FlagIn(KindApiIn):
    """A flag on one completion: what is wrong, named and/or in words."""

    kind: Literal["flag"]
    flags: Annotated[list[Literal["unsafe", "broken", "off_task"]], Field(max_length=3)] = Field(
        default_factory=list, description="what is wrong")
    reason: Annotated[str, Field(max_length=REASON_MAX)] = Field("", description="what is wrong, in words")


@kind_service("flag")
def feedback_flag(
    *, run: Run, experience: Experience | int | None, flags: Sequence[str] = (), reason: str = "",
    author: Person | None = None, api_key: ApiKeyRow | None = None, comment: str = "",
) -> Feedback:
    """A flag on one completion (unsafe, broken, off_task, and/or a reason in words). A
    flag is a judgement of the item too: it leaves the author's queue."""
    value = FlagValue(flags=flags, reason=reason)  # type: ignore[arg-type]  # any sequence: checked in __post_init__
    comment, who = submit.comment_clean(comment), submit.person_of(author)
    with transaction.atomic():
        target = submit.experience_of_run(run=run, experience=experience, what="experience_id")
        fb = submit.feedback_row_create(run=run, kind="flag", value=value, targets=[target], group_id=target.group_id,
                                        author=who, api_key=api_key, comment=comment)
        assignments_finish(run=run, annotator=who, experience_ids=[target.pk], group_id=target.group_id)
        submit.feedback_announce(run=run, feedback=fb, ready=False)
    return fb


@kind_register
class Flag(FeedbackKind):
    name = "flag"
    Value = FlagValue
    target = "experience"
    marks_flagged = True
    revisable = True
    revision_template = "feedback/revise/_flag.html"
    ApiIn = FlagIn
    cli = True
    cli_help = "a completion marked unsafe, broken or off task, or a reason in words"
    # Given on the item's card itself (feedback/_item.html), beside the rating.
    page_mark = "flagged"

    def cli_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--experience", type=int, help="the experience")
        parser.add_argument("--flags", default="", help=f"comma-separated {', '.join(FLAGS)}")
        parser.add_argument("--reason", default="", help="what is wrong, in words")

    def cli_store(self, opts: Mapping[str, Any], *, who: Who) -> Feedback:
        flags = [f.strip() for f in opts["flags"].split(",") if f.strip()]
        return self.store(experience=opts["experience"], flags=flags, reason=opts["reason"], **who)

    def revision_values(self, fb: Feedback) -> dict[str, object]:
        value = fb.value if isinstance(fb.value, dict) else {}
        return {"flags": list(value.get("flags") or []), "choices": FLAGS, "reason": str(value.get("reason") or "")}

    def revision_store(self, form: PageForm, *, experience: Experience, who: Who) -> Feedback:
        # The card's flag boxes, and the reason in words a flag from the API, CLI or bulk action has.
        return self.store(experience=experience, flags=form.getlist("flags"), reason=form.get("reason", ""), **who)

    def api_store(self, payload: KindApiIn, *, experience: int, who: Who) -> Feedback:
        assert isinstance(payload, FlagIn)
        # An older client flags without saying why; the flag still needs to read as one.
        reason = payload.reason or ("" if payload.flags else API_FLAG_REASON)
        return self.store(experience=experience, flags=payload.flags, reason=reason, **who)
