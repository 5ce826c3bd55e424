"""The annotation form's submit: a rating and flags on one completion in one go. It stands
above the two kinds' modules and calls their services directly (it called them by name
through the registry from apps.feedback.kinds.submit, below the kinds, so a rating entered
submit, the registry and the rating's module twice each on its way to its reward)."""

from __future__ import annotations

from collections.abc import Sequence

from django.db import transaction

from apps.buffer.models import Experience
from apps.feedback.models import Feedback, Person
from apps.feedback.kinds.flag import feedback_flag
from apps.feedback.kinds.rating import feedback_rate
from apps.runs.models import Run
from kernel.exceptions import InvalidInput


def feedback_rate_and_flag(
    *, run: Run, author: Person | None, experience: Experience | int, score: int | None = None, thumb: str | None = None,
    flags: Sequence[str] = (), comment: str = "",
) -> list[Feedback]:
    """The annotation form's submit: a rating and/or flags on one completion, all or none.
    Each through its kind's service (apps.feedback.kinds.rating, .flag)."""
    if score is None and thumb is None and not flags:
        raise InvalidInput("give a rating (1-5 or a thumb) or at least one flag", field="score")
    if score is not None and thumb is not None:
        raise InvalidInput("give a score or a thumb, not both", field="score")

    def rate(note: str) -> Feedback:
        return feedback_rate(run=run, author=author, experience=experience, score=score, thumb=thumb, comment=note)

    def flag(note: str) -> Feedback:
        return feedback_flag(run=run, author=author, experience=experience, flags=flags, comment=note)

    # One label is its own service's transaction: wrapped in another, it cost a savepoint and
    # its release, two of a rating's round trips to the database.
    if not flags:
        return [rate(comment)]
    if score is None and thumb is None:
        return [flag(comment)]
    with transaction.atomic():
        return [rate(comment), flag("")]
