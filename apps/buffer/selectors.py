"""Reads of the buffer."""

from __future__ import annotations

from django.db.models import Count

from apps.buffer.models import Experience, TaskAttempt
from apps.runs.models import Run


def buffer_counts(*, run: Run) -> dict[str, int]:
    """Experiences of the run by status, every status present (zero when none)."""
    counts = dict.fromkeys(Experience.Status.values, 0)
    for row in Experience.objects.filter(run=run).values("status").annotate(n=Count("id")):
        counts[row["status"]] = row["n"]
    return counts


def task_attempt_counts(*, run: Run) -> dict[str, int]:
    counts = dict.fromkeys(TaskAttempt.Status.values, 0)
    for row in TaskAttempt.objects.filter(run=run).values("status").annotate(n=Count("id")):
        counts[row["status"]] = row["n"]
    return counts


def experience_group(*, run: Run, group_id: str) -> list[Experience]:
    return list(Experience.objects.filter(run=run, group_id=group_id).order_by("id"))
