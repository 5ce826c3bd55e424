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
