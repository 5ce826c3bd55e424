"""Gold items: experiences whose right rating the owner knows (apps.rewards.models.GoldItem)."""

from __future__ import annotations

from typing import Any

from apps.buffer.models import Experience
from apps.feedback.policy import rating_normalise
from apps.rewards.models import GoldItem
from apps.runs.models import Run


class GoldInvalid(ValueError):
    """The gold item was malformed; nothing was stored."""


def gold_item_mark(*, run: Run, experience_id: Any, score: Any, actor: Any) -> GoldItem:
    """Mark an experience of the run as gold with its right 1..5 rating (again: a new answer)."""
    try:
        pk = int(experience_id)
    except (TypeError, ValueError):
        raise GoldInvalid("experience: give the id of an experience of this run") from None
    try:
        answer = rating_normalise(score=int(str(score).strip()))
    except ValueError:
        raise GoldInvalid("score: the right rating is a whole number from 1 to 5") from None
    exp = Experience.objects.filter(run=run, pk=pk, is_expert=False).first()
    if exp is None:
        raise GoldInvalid(f"experience: {pk} is not a completion of run {run.pk}")
    item, _ = GoldItem.objects.update_or_create(run=run, experience=exp,
                                                defaults={"answer": answer, "created_by": actor})
    return item


def gold_item_unmark(*, run: Run, experience_id: int) -> bool:
    return GoldItem.objects.filter(run=run, experience_id=experience_id).delete()[0] > 0
