"""Reads of the buffer."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db.models import Count, Exists, OuterRef, Q, QuerySet

from apps.buffer.models import Experience, TaskAttempt
from apps.runs.models import Run
from apps.buffer.models import Task


def buffer_counts(*, run: Run) -> dict[str, int]:
    """Experiences of the run by status, every status present (zero when none)."""
    counts = dict.fromkeys(Experience.Status.values, 0)
    for row in Experience.objects.filter(run=run).values("status").annotate(n=Count("id")):
        counts[row["status"]] = row["n"]
    return counts


def tasks_exhausted(*, run: Run) -> bool:
    """Every epoch of the run's taskset has been explored: nothing queued, nothing leased,
    no epoch left to queue. A run without tasks is not exhausted (the environment API may
    still add some)."""
    attempts = TaskAttempt.objects.filter(run=run)
    last_epoch = attempts.order_by("-epoch").values_list("epoch", flat=True).first()
    if last_epoch is None or last_epoch + 1 < run.cfg.epochs:
        return False
    return not attempts.filter(status__in=[TaskAttempt.Status.QUEUED, TaskAttempt.Status.LEASED]).exists()


def experiences_claimable(
    *, run: Run, now: datetime, min_version: int | None = None, expert: bool | None = None
) -> QuerySet[Experience]:
    """The run's experiences that `batch_claim` may lease now: ready, within the staleness
    bound, out of their replay cooldown, not held for a person who has their group open
    (`held_until`, every member alike)."""
    qs = Experience.objects.filter(run=run, status=Experience.Status.READY).filter(
        Q(held_until__isnull=True) | Q(held_until__lte=now))
    if min_version is not None:
        qs = qs.filter(model_version__gte=min_version)
    if expert is not None:
        qs = qs.filter(is_expert=expert)
    cooldown = run.cfg.replay.cooldown_seconds
    if cooldown > 0:
        qs = qs.filter(Q(last_used_at__isnull=True) | Q(last_used_at__lte=now - timedelta(seconds=cooldown)))
    return qs


def experiences_in_whole_groups(*, run: Run, qs: QuerySet[Experience]) -> QuerySet[Experience]:
    """`qs` without the members of groups still in flight (a member pending feedback or leased).

    The in-flight groups come as one set (a hashed subplan on Postgres) from the small
    in-flight index: a correlated NOT EXISTS let the planner, on a fast-growing table whose
    statistics lag, scan the whole run once per candidate row (claims took seconds)."""
    in_flight = Experience.objects.filter(
        run=run, status__in=[Experience.Status.PENDING, Experience.Status.LEASED]
    ).values("group_id")
    return qs.exclude(group_id__in=in_flight)


def experience_group(*, run: Run, group_id: str) -> list[Experience]:
    return list(Experience.objects.filter(run=run, group_id=group_id).order_by("id"))


# --- the experience browser ------------------------------------------------------------

# The longest text search kept (a longer one is cut: a search box, not a document).
SEARCH_MAX = 200


@dataclass
class ExperienceFilters:
    status: str = ""
    reward_min: float | None = None
    reward_max: float | None = None
    version: int | None = None
    domain: str = ""
    annotator: str = ""
    flagged: str = ""  # "", "yes", "no"
    # Text search: the prompt, the completion or a label's comment holds it (any case).
    q: str = ""
    before: int | None = None  # keyset pagination: ids below this one
    errors: dict[str, str] = field(default_factory=dict)
    # What was typed, so a refused value is shown back beside its error.
    raw: dict[str, str] = field(default_factory=dict)

    def query(self, **changes: str | float | None) -> str:
        """The filters as a query string (for links to the next page)."""
        from urllib.parse import urlencode

        values = {
            "status": self.status, "reward_min": self.reward_min, "reward_max": self.reward_max,
            "version": self.version, "domain": self.domain, "annotator": self.annotator, "flagged": self.flagged,
            "q": self.q, "before": self.before,
        }
        values.update(changes)
        return urlencode({k: v for k, v in values.items() if v not in (None, "")})


def experience_filters_parse(params: Mapping[str, str]) -> ExperienceFilters:
    """Filters from query parameters; a malformed one is reported by name and ignored."""
    filters = ExperienceFilters()
    filters.raw = {k: str(params.get(k) or "").strip()[:100] for k in ("reward_min", "reward_max", "version", "status", "flagged")}
    errors: dict[str, str] = {}
    status = (params.get("status") or "").strip()
    if status and status not in Experience.Status.values:
        errors["status"] = f"unknown status {status!r}"
    else:
        filters.status = status
    for name, cast in (("reward_min", float), ("reward_max", float), ("version", int), ("before", int)):
        raw = (params.get(name) or "").strip()
        if not raw:
            continue
        try:
            value = cast(raw)
            if cast is float and not math.isfinite(value):
                raise ValueError
            setattr(filters, name, value)
        except ValueError:
            errors[name] = f"{raw!r} is not {'a whole number' if cast is int else 'a number'}"
    if filters.reward_min is not None and filters.reward_max is not None and filters.reward_min > filters.reward_max:
        errors["reward_max"] = "the maximum is below the minimum"
    flagged = (params.get("flagged") or "").strip()
    if flagged not in ("", "yes", "no"):
        errors["flagged"] = "use yes or no"
    else:
        filters.flagged = flagged
    filters.domain = (params.get("domain") or "").strip()[:50]
    filters.annotator = (params.get("annotator") or "").strip()[:150]
    filters.q = (params.get("q") or "").strip()[:SEARCH_MAX]
    filters.errors = errors
    return filters


def experience_filter_choices(*, run: Run) -> dict[str, list[str] | list[int]]:
    """Values offered in the browser's filter menus."""
    from django.contrib.auth import get_user_model


    versions = list(Experience.objects.filter(run=run).values_list("model_version", flat=True).distinct().order_by("model_version"))
    domains = list(
        Task.objects.filter(taskset_id=run.taskset_id).values_list("domain", flat=True).distinct().order_by("domain")
    ) if run.taskset_id else []
    annotators = list(
        get_user_model().objects.filter(feedback__run=run).values_list("username", flat=True).distinct().order_by("username")
    )
    return {"statuses": list(Experience.Status.values), "versions": versions, "domains": domains, "annotators": annotators}


