"""A feedback kind of a test's own, in one module as a kind is (apps/feedback/kinds/rating.py):
its value, its service, its body on the environment API, its `rft feedback` options, its
panel on the annotation page (the template beside it, kind_templates/feedback/_length_fit.html)
and its revision's fields (_length_fit_revise.html).

The persona: a researcher whose raters say only whether an answer is too short, too long or
right ("length_fit"), and who wants that to steer training like a rating does. Importing the
module registers it, as the built-in kinds' modules register themselves; tests take it out
again (tests/feedback/test_kind_registry.py's fixture)."""

from __future__ import annotations

from argparse import ArgumentParser
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from apps.feedback.kinds import FeedbackKind, KindApiIn, KindValue, PageForm, Who, kind_register, kind_service
from apps.feedback.kinds.submit import feedback_store
from kernel.fold import Vote
from kernel.exceptions import InvalidInput

if TYPE_CHECKING:
    from apps.buffer.models import Experience
    from apps.feedback.models import Feedback
    from apps.runs.models import Run

NAME = "length_fit"
VERDICTS = ("too_short", "right", "too_long")


@dataclass(frozen=True)
class LengthFitValue(KindValue):
    """{"verdict": "too_short" | "right" | "too_long"}."""

    verdict: str

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise InvalidInput(f"a length verdict is one of {', '.join(VERDICTS)}", field="verdict")


class LengthFitIn(KindApiIn):
    """A length verdict on one completion."""

    kind: Literal["length_fit"]
    verdict: Literal["too_short", "right", "too_long"] = Field(description="how the answer's length fits")


@kind_service(NAME)
def feedback_length_fit(*, run: Run, experience: Experience | int | None, verdict: str, author: Any = None,
                        api_key: Any = None, comment: str = "") -> Feedback:
    return feedback_store(run=run, kind=NAME, value=LengthFitValue(verdict=verdict), experience=experience,
                          author=author, api_key=api_key, comment=comment)


@kind_register
class LengthFit(FeedbackKind):
    name = NAME
    Value = LengthFitValue
    target = "experience"
    folds = True
    labels = True
    pairs_by_fold = True
    ApiIn = LengthFitIn
    cli = True
    cli_help = "whether a completion's length is right"
    panel_template = "feedback/_length_fit.html"
    panel_link = "Length"
    panel_key = "l"
    page_mark = "length judged"
    revisable = True
    revision_template = "feedback/_length_fit_revise.html"

    def votes(self, fb: Feedback) -> Iterable[Vote]:
        value = self.parse(fb.value)
        assert isinstance(value, LengthFitValue) and fb.experience_id is not None
        return [(fb.experience_id, 1.0 if value.verdict == "right" else 0.0, False)]

    def api_store(self, payload: KindApiIn, *, experience: int, who: Who) -> Feedback:
        assert isinstance(payload, LengthFitIn)
        return self.store(experience=experience, verdict=payload.verdict, **who)

    def cli_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--experience", type=int, help="the experience")
        parser.add_argument("--verdict", choices=VERDICTS, help="how its length fits")

    def cli_store(self, opts: Mapping[str, Any], *, who: Who) -> Feedback:
        return self.store(experience=opts["experience"], verdict=opts["verdict"] or "", **who)

    def panel_context(self, *, run: Run, experience: Experience, query: Mapping[str, str]) -> dict[str, object]:
        return {"verdicts": VERDICTS}

    def page_store(self, form: PageForm, *, experience: Experience, who: Who) -> Feedback:
        return self.store(experience=experience, verdict=form.get("verdict", ""), **who)

    def revision_values(self, fb: Feedback) -> dict[str, object]:
        return {"verdict": (fb.value or {}).get("verdict"), "verdicts": VERDICTS}
