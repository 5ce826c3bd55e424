"""Reads of runs, and who may see what."""

from __future__ import annotations

from typing import Any

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


# --- the dashboard's reads -------------------------------------------------------------

# Charts of the run page: metrics go to the first group whose pattern matches their name
# (the browser applies the same patterns to metrics that arrive live); the rest get a chart
# each. Names are whatever the explorer and trainer record through `metric_record`.
CHART_GROUPS: list[dict[str, str]] = [
    {"id": "reward", "title": "Reward mean / std", "pattern": r"^(reward|rewards?)([/_.](mean|std|avg|max|min))?$"},
    {"id": "eval", "title": "Evaluation (held-out)", "pattern": r"^eval/(reward|accuracy)"},
    {"id": "accuracy", "title": "Accuracy per domain", "pattern": r"^acc(uracy)?([/_.].*)?$"},
    {"id": "loss", "title": "Loss", "pattern": r"(^|[/_.])loss([/_.].*)?$"},
    {"id": "kl", "title": "KL", "pattern": r"(^|[/_.])kl([/_.].*)?$"},
    {"id": "entropy", "title": "Entropy", "pattern": r"entropy"},
    {"id": "clip", "title": "Clip fraction", "pattern": r"clip"},
    {"id": "length", "title": "Response length", "pattern": r"(response|completion)[/_.]?len(gth)?|^len(gth)?([/_.].*)?$"},
    {"id": "throughput", "title": "Tokens / s", "pattern": r"tokens?[/_.]?(per[/_.]?s(ec(ond)?)?|/s|_s)$|throughput"},
    {"id": "staleness", "title": "Staleness", "pattern": r"stale"},
]
REWARD_SPARK_PATTERN = CHART_GROUPS[0]["pattern"]


def metric_series(*, run: Run, last_steps: int = 2000) -> dict[str, list[list[float]]]:
    """{metric name: [[step, value], ...]} over the run's last `last_steps` steps."""
    from django.db.models import Max

    from apps.runs.models import Metric

    top = Metric.objects.filter(run=run).aggregate(top=Max("step"))["top"]
    if top is None:
        return {}
    series: dict[str, list[list[float]]] = {}
    rows = (
        Metric.objects.filter(run=run, step__gt=top - last_steps)
        .order_by("name", "step", "id")
        .values_list("name", "step", "value")
    )
    for name, step, value in rows:
        series.setdefault(name, []).append([step, value])
    return series


def reward_sparkline(*, run: Run, points: int = 30) -> list[float]:
    """The last `points` values of the run's mean reward metric, oldest first."""
    from apps.runs.models import Metric

    qs = Metric.objects.filter(run=run, name__regex=REWARD_SPARK_PATTERN).exclude(name__iregex=r"(std|max|min)$")
    values = list(qs.order_by("-step", "-id").values_list("value", flat=True)[:points])
    return values[::-1]


def sparkline_points(values: list[float], *, width: int = 100, height: int = 24) -> str:
    """SVG polyline points for `values` scaled into the box."""
    if len(values) < 2:
        return ""
    low, high = min(values), max(values)
    span = (high - low) or 1.0
    step = width / (len(values) - 1)
    return " ".join(f"{i * step:.1f},{height - (v - low) / span * (height - 2) - 1:.1f}" for i, v in enumerate(values))


def run_last_event(*, run: Run) -> dict[str, Any] | None:
    """The most recent thing that happened to the run: a control, a metric, a version, a
    weight load or an experience."""
    from apps.buffer.models import Experience
    from apps.runs.models import AuditEntry, Metric, ModelVersion, WeightLoad

    candidates: list[dict[str, Any]] = []
    audit = AuditEntry.objects.filter(run=run).order_by("-created_at").first()
    if audit:
        candidates.append({"at": audit.created_at, "text": f"{audit.action} by {audit.actor or 'system'}"})
    metric = Metric.objects.filter(run=run).order_by("-time", "-id").first()
    if metric:
        candidates.append({"at": metric.time, "text": f"metrics at step {metric.step}"})
    version = ModelVersion.objects.filter(run=run).order_by("-created_at").first()
    if version:
        candidates.append({"at": version.created_at, "text": f"v{version.number} published"})
    load = WeightLoad.objects.filter(run=run).order_by("-loaded_at").first()
    if load:
        candidates.append({"at": load.loaded_at, "text": f"v{load.version} loaded by {load.worker}"})
    # Ids grow with time; created_at has no index of its own (it would tax every claim).
    exp = Experience.objects.filter(run=run).order_by("-id").values("created_at").first()
    if exp:
        candidates.append({"at": exp["created_at"], "text": "experience written"})
    return max(candidates, key=lambda c: c["at"]) if candidates else None


def run_rows(*, user: Any) -> list[dict[str, Any]]:
    """The runs list: each visible run with its buffer counts, reward sparkline and last event."""
    from django.db.models import Count

    from apps.buffer.models import Experience

    runs = list(runs_visible_to(user=user).select_related("owner"))
    counts: dict[int, dict[str, int]] = {run.pk: dict.fromkeys(Experience.Status.values, 0) for run in runs}
    for row in (
        Experience.objects.filter(run__in=[r.pk for r in runs]).values("run_id", "status").annotate(n=Count("id"))
    ):
        counts[row["run_id"]][row["status"]] = row["n"]
    rows = []
    for run in runs:
        spark = reward_sparkline(run=run)
        rows.append({
            "run": run,
            "counts": counts[run.pk],
            "spark": spark,
            "spark_points": sparkline_points(spark),
            "last_event": run_last_event(run=run),
        })
    return rows


def feedback_per_minute(*, run: Run, minutes: int = 120) -> list[list[float]]:
    """[[unix minute start, count], ...] of feedback on the run over the last `minutes`."""
    from datetime import timedelta

    from django.db.models import Count
    from django.db.models.functions import TruncMinute
    from django.utils import timezone

    from apps.feedback.models import Feedback

    since = timezone.now() - timedelta(minutes=minutes)
    rows = (
        Feedback.objects.filter(run=run, created_at__gte=since)
        .annotate(minute=TruncMinute("created_at"))
        .values("minute")
        .annotate(n=Count("id"))
        .order_by("minute")
    )
    return [[row["minute"].timestamp(), row["n"]] for row in rows]


def weight_sync_timeline(*, run: Run) -> list[dict[str, Any]]:
    """Per model version, newest first: when it was published and when each explorer loaded it."""
    from apps.runs.models import ModelVersion, WeightLoad

    versions: dict[int, dict[str, Any]] = {}
    for v in ModelVersion.objects.filter(run=run).order_by("number"):
        versions[v.number] = {"number": v.number, "published_at": v.created_at, "train_step": v.train_step,
                              "checkpoint": v.checkpoint, "loads": []}
    for load in WeightLoad.objects.filter(run=run).order_by("loaded_at"):
        entry = versions.setdefault(load.version, {"number": load.version, "published_at": None, "train_step": None,
                                                   "checkpoint": "", "loads": []})
        entry["loads"].append({"worker": load.worker, "loaded_at": load.loaded_at, "seconds": load.seconds,
                               "lag": (load.loaded_at - entry["published_at"]).total_seconds() if entry["published_at"] else None})
    return [versions[n] for n in sorted(versions, reverse=True)]


def run_audit(*, run: Run, limit: int = 50) -> list[Any]:
    from apps.runs.models import AuditEntry

    return list(AuditEntry.objects.filter(run=run).select_related("actor").order_by("-created_at")[:limit])
def preferences_among(*, run: Run, ids: list[int]) -> list[tuple[int, int]]:
    """(winner id, loser id) from pairwise feedback whose two experiences are both in `ids`,
    oldest first. A pairwise feedback's `experience` is A and `other` is B, and its value is
    {"winner": "a" | "b" | "tie"} (the one shape, see Feedback); ties carry no preference.
    Late choices count: the pair was stored, and DPO learns from it.
    """
    from apps.feedback.models import Feedback

    wanted = set(ids)
    rows = Feedback.objects.filter(
        run=run, kind=Feedback.Kind.PAIRWISE, experience_id__in=wanted, other_id__in=wanted,
        value__winner__in=["a", "b"],
    ).order_by("created_at", "id").values_list("experience_id", "other_id", "value__winner")
    return [(a, b) if winner == "a" else (b, a) for a, b, winner in rows]


def eval_best(*, run: Run) -> dict[str, float] | None:
    """The evaluated version with the highest `eval/reward_mean` (the earliest on ties):
    {"version", "reward_mean", "step"}, or None before any evaluation."""
    from apps.runs.models import Metric

    means = dict(Metric.objects.filter(run=run, name="eval/reward_mean").values_list("step", "value"))
    if not means:
        return None
    versions = dict(Metric.objects.filter(run=run, name="eval/version").values_list("step", "value"))
    step = max(sorted(means), key=lambda s: means[s])
    return {"version": int(versions.get(step, 0)), "reward_mean": means[step], "step": step}
