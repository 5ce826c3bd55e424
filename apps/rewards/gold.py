"""Gold items: experiences whose right rating the owner knows (apps.rewards.models.GoldItem)."""

from __future__ import annotations

from django.contrib.auth.models import User

from apps.buffer.models import Experience
from apps.rewards.models import GoldItem
from kernel.fold import rating_normalise
from apps.runs.models import Run
from kernel.exceptions import InvalidInput


def gold_item_mark(*, run: Run, experience_id: int | str, score: int | str,
                   actor: User | None) -> GoldItem:
    """Mark an experience of the run as gold with its right 1..5 rating (again: a new answer)."""
    try:
        pk = int(experience_id)
    except (TypeError, ValueError):
        raise InvalidInput("give the id of an experience of this run", field="experience") from None
    try:
        answer = rating_normalise(score=int(str(score).strip()))
    except ValueError:
        raise InvalidInput("the right rating is a whole number from 1 to 5", field="score") from None
    exp = Experience.objects.filter(run=run, pk=pk, is_expert=False).first()
    if exp is None:
        raise InvalidInput(f"{pk} is not a completion of run {run.pk}", field="experience")
    item, _ = GoldItem.objects.update_or_create(run=run, experience=exp,
                                                defaults={"answer": answer, "created_by": actor})
    return item


def gold_item_unmark(*, run: Run, experience_id: int) -> bool:
    return GoldItem.objects.filter(run=run, experience_id=experience_id).delete()[0] > 0
