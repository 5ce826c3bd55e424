"""Reads of runs, and who may see what."""

from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db.models import Q, QuerySet

from apps.runs.models import Run, RunMember


def runs_visible_to(*, user: AbstractBaseUser | AnonymousUser) -> QuerySet[Run]:
    if not user.is_authenticated:
        return Run.objects.none()
    if user.is_staff:
        return Run.objects.all()
    return Run.objects.filter(Q(owner=user) | Q(members__user=user)).distinct()


def run_role(*, run: Run, user: AbstractBaseUser | AnonymousUser) -> str | None:
    """'owner' (owner or staff), 'annotator', 'viewer', or None for no access."""
    if not user.is_authenticated:
        return None
    if user.is_staff or run.owner_id == user.pk:
        return "owner"
    return RunMember.objects.filter(run=run, user=user).values_list("role", flat=True).first()


def run_can_view(*, run: Run, user: AbstractBaseUser | AnonymousUser) -> bool:
    return run_role(run=run, user=user) is not None


def preferences_among(*, run: Run, ids: list[int]) -> list[tuple[int, int]]:
    """(winner id, loser id) from pairwise feedback whose two experiences are both in `ids`.

    A pairwise feedback's `experience` is A and `other` is B; its value names the winner:
    "a" / "b" (any case, also "left" / "right"), or {"winner": "a" | "b" | <experience id>}.
    Ties and anything else carry no preference.
    """
    from apps.feedback.models import Feedback

    wanted = set(ids)
    out: list[tuple[int, int]] = []
    rows = Feedback.objects.filter(
        run=run, kind=Feedback.Kind.PAIRWISE, experience_id__in=wanted, other_id__in=wanted
    ).values_list("experience_id", "other_id", "value")
    for a, b, value in rows:
        winner = value.get("winner") if isinstance(value, dict) else value
        if isinstance(winner, str):
            winner = {"a": a, "left": a, "b": b, "right": b}.get(winner.strip().lower())
        if winner == a:
            out.append((a, b))
        elif winner == b:
            out.append((b, a))
    return out
