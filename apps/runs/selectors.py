"""Reads of runs, and who may see what."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db.models import Q, QuerySet

from apps.runs.models import Run, RunMember


def _is_staff(user: AbstractBaseUser | AnonymousUser) -> bool:
    # Staff is a field of Django's User, not of the abstract base that request.user is typed as.
    return bool(getattr(user, "is_staff", False))


def runs_visible_to(*, user: AbstractBaseUser | AnonymousUser) -> QuerySet[Run]:
    if not user.is_authenticated:
        return Run.objects.none()
    if _is_staff(user):
        return Run.objects.all()
    return Run.objects.filter(Q(owner=user) | Q(members__user=user)).distinct()


def run_role(*, run: Run, user: AbstractBaseUser | AnonymousUser) -> str | None:
    """'owner' (owner or staff), 'annotator', 'viewer', or None for no access."""
    if not user.is_authenticated:
        return None
    if _is_staff(user) or run.owner_id == user.pk:
        return "owner"
    return RunMember.objects.filter(run=run, user_id=user.pk).values_list("role", flat=True).first()


def run_can_view(*, run: Run, user: AbstractBaseUser | AnonymousUser) -> bool:
    return run_role(run=run, user=user) is not None


def workers_visible(*, user: AbstractBaseUser | AnonymousUser, run: Run | None = None) -> list[dict[str, Any]]:
    """Worker health as `user` may see it: every worker's state, but of the tasks it runs
    only those of runs the user may see (of `run` alone when given), by name and run, never
    their arguments; the rest are counted as `hidden`."""
    from apps.runs.heartbeat import workers_health

    visible = {run.pk} if run is not None else set(runs_visible_to(user=user).values_list("pk", flat=True))
    rows = []
    for row in workers_health():
        tasks = [{"name": t.get("name", ""), "run_id": t.get("run_id"), "started_at": t.get("started_at")}
                 for t in row["beat"].active if t.get("run_id") in visible]
        rows.append({**row, "tasks": tasks, "hidden": len(row["beat"].active) - len(tasks)})
    return rows


# --- the dashboard's reads -------------------------------------------------------------

# Charts of the run page: metrics go to the first group whose pattern matches their name
# (the browser applies the same patterns to metrics that arrive live); the rest get a chart
# each. Names are whatever the explorer and trainer record through `metric_record`.
CHART_GROUPS: list[dict[str, str]] = [
    {"id": "reward", "title": "Reward mean / std", "section": "rewards", "pattern": r"^(reward|rewards?)([/_.](mean|std|avg|max|min))?$"},
    {"id": "accuracy", "title": "Accuracy per domain", "section": "rewards", "pattern": r"^acc(uracy)?([/_.].*)?$"},
    # The evaluator's scores (workers/evaluation.py); its response length charts with the
    # training one, its version / task count / best version are constants, its seconds "other".
    {"id": "eval", "title": "Held-out evaluation", "section": "rewards", "pattern": r"^eval[/_.](.*[/_.])?(reward|acc|accuracy|score|pass|correct)([/_.@].*)?$"},
    {"id": "loss", "title": "Loss", "section": "loss", "pattern": r"(^|[/_.])loss([/_.].*)?$"},
    {"id": "kl", "title": "KL", "section": "loss", "pattern": r"(^|[/_.])kl([/_.].*)?$"},
    {"id": "entropy", "title": "Entropy", "section": "loss", "pattern": r"entropy"},
    {"id": "clip", "title": "Clip fraction", "section": "loss", "pattern": r"clip"},
    {"id": "length", "title": "Response length", "section": "throughput", "pattern": r"(response|completion)[/_.]?len(gth)?|^len(gth)?([/_.].*)?$"},
    {"id": "throughput", "title": "Tokens / s", "section": "throughput", "pattern": r"tokens?[/_.]?(per[/_.]?s(ec(ond)?)?|/s|_s)$|throughput"},
    {"id": "staleness", "title": "Staleness", "section": "throughput", "pattern": r"stale"},
]
# Sections of the run page's charts, in order; metrics no group claims go to "other".
CHART_SECTIONS: list[dict[str, str]] = [
    {"id": "rewards", "title": "Rewards and accuracy"},
    {"id": "loss", "title": "Loss and KL"},
    {"id": "throughput", "title": "Throughput"},
    {"id": "other", "title": "Other metrics"},
    {"id": "buffer", "title": "Buffer over time"},
    {"id": "feedback", "title": "Feedback over time"},
]
# Metrics that are settings rather than measurements: a table of their last values, no chart.
CONSTANT_PATTERN = (r"(^|[/_.])(lr|learning_rate|batch_size|train_batch_size|explore_batch_size|repeat_times|beta|epsilon)$"
                    r"|^eval[/_.](version|tasks|best_version)$")
REWARD_SPARK_PATTERN = CHART_GROUPS[0]["pattern"]


def metric_series(*, run: Run, last_steps: int = 2000) -> dict[str, list[list[float]]]:
    """{metric name: [[step, value, unix time], ...]} over the run's last `last_steps` steps."""
    from django.db.models import Max

    from apps.runs.models import Metric

    top = Metric.objects.filter(run=run).aggregate(top=Max("step"))["top"]
    if top is None:
        return {}
    series: dict[str, list[list[float]]] = {}
    rows = (
        Metric.objects.filter(run=run, step__gt=top - last_steps)
        .order_by("name", "step", "id")
        .values_list("name", "step", "value", "time")
    )
    for name, step, value, time in rows:
        series.setdefault(name, []).append([step, value, round(time.timestamp(), 3)])
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
        role = run_role(run=run, user=user)
        rows.append({
            "run": run,
            "role": role,
            "waiting": annotation_waiting(run=run, user=user) if role in ("owner", "annotator") else 0,
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
def run_task_failures(*, run: Run, limit: int = 10) -> list[Any]:
    """The run's last failed explore and train tasks, newest first."""
    from apps.runs.models import TaskFailure

    return list(TaskFailure.objects.filter(run=run).order_by("-created_at", "-id")[:limit])


def run_state(*, run: Run) -> dict[str, Any]:
    """What the run page's header shows, for its live updates."""
    return {"status": run.status, "explore_step": run.explore_step, "train_step": run.train_step,
            "total_steps": run.cfg.total_steps, "version": run.current_version, "error": run.error}


def run_may_create(*, user: Any) -> bool:
    """Who sees "New run": staff, owners of a run, and anyone who is not only an annotator or
    viewer of others' runs (a fresh account owns nothing yet and may start)."""
    if not user.is_authenticated:
        return False
    if user.is_staff or Run.objects.filter(owner=user).exists():
        return True
    return not RunMember.objects.filter(user=user).exists()


def annotation_waiting(*, run: Run, user: Any) -> int:
    """What waits for `user` on the run's annotation page: items leased to them, and
    completions still waiting for human feedback that they have not been handed yet."""
    from apps.buffer.models import Experience
    from apps.feedback.models import Assignment

    leased = Assignment.objects.filter(run=run, annotator=user, status=Assignment.Status.LEASED).count()
    open_ = (Experience.objects.filter(run=run, is_expert=False, status=Experience.Status.PENDING)
             .exclude(assignments__annotator=user).count())
    return leased + open_


def tasksets_for(*, user: Any) -> list[Any]:
    """Tasksets a user may start a run on: their own, and those of runs they own (all for
    staff), newest first, with their task counts."""
    from django.db.models import Count

    from apps.buffer.models import Taskset

    if not getattr(user, "is_authenticated", False):
        return []
    qs = Taskset.objects.all() if user.is_staff else Taskset.objects.filter(Q(owner=user) | Q(runs__owner=user)).distinct()
    return list(qs.annotate(n_tasks=Count("tasks", distinct=True)).order_by("-created_at", "-id")[:200])


def run_waiting(*, run: Run) -> list[dict[str, Any]]:
    """What a running run waits for, and since when: people's feedback, a model version
    from the trainer, a full batch, a worker for a queue. Empty when nothing holds it up."""
    from datetime import timedelta

    from django.db.models import Max, Min
    from django.utils import timezone

    from apps.buffer.models import Experience
    from apps.runs import policy
    from apps.runs.heartbeat import workers_health
    from apps.runs.models import AuditEntry, ModelVersion
    from apps.runs.orchestration import batch_plan, train_readiness

    if run.status != Run.Status.RUNNING:
        return []
    cfg = run.cfg
    out: list[dict[str, Any]] = []
    started = (AuditEntry.objects.filter(run=run, action__in=("start", "resume")).aggregate(t=Max("created_at"))["t"]
               or run.updated_at)
    latest_version = ModelVersion.objects.filter(run=run).aggregate(t=Max("created_at"))["t"] or started

    if cfg.feedback.mode != "auto":
        pending = Experience.objects.filter(run=run, status=Experience.Status.PENDING, is_expert=False)
        agg = pending.aggregate(since=Min("created_at"))
        if agg["since"] is not None:
            groups = pending.values("group_id").distinct().count()
            fallback_at = agg["since"] + timedelta(seconds=cfg.feedback.wait_seconds)
            then = ("then trains on the automatic reward" if cfg.feedback.fallback == "auto" else "then is dropped")
            out.append({"what": "people", "since": agg["since"],
                        "text": f"{groups} group{'s' if groups != 1 else ''} wait for people's feedback; the oldest "
                                f"{then} at {timezone.localtime(fallback_at):%H:%M:%S} ({cfg.feedback.wait_seconds:g} s wait)"})
    if policy.explores(cfg) and run.explore_step < cfg.total_steps:
        k = run.explore_step + 1
        if policy.explore_version(cfg=cfg, explore_step=k, current_version=run.current_version) is None:
            need = policy.version_required(cfg=cfg, explore_step=k)
            out.append({"what": "version", "since": latest_version,
                        "text": f"the explorer waits for model v{need} from the trainer before explore step {k} "
                                f"(now v{run.current_version}; {cfg.mode}, max staleness {cfg.max_staleness})"})
    if policy.trains(cfg) and run.train_step < cfg.total_steps:
        readiness = train_readiness(run=run)
        if not readiness.ready and not readiness.final:
            plan = batch_plan(cfg=cfg)
            out.append({"what": "batch", "since": latest_version,
                        "text": f"the trainer waits for a full batch for step {run.train_step + 1}: "
                                f"{readiness.usual} of {plan.usual} trainable experiences"
                                + (f", {readiness.expert} of {plan.expert} expert" if plan.expert else "")})
    health = workers_health()
    for queue, needed in (("rollout", policy.explores(cfg) and run.explore_step < cfg.total_steps),
                          ("train", policy.trains(cfg) and run.train_step < cfg.total_steps)):
        if not needed:
            continue
        serving = [w for w in health if queue in (w["beat"].queues or [])]
        if not any(w["state"] in ("idle", "busy") for w in serving):
            last = max((w["beat"].last_seen for w in serving), default=None)
            out.append({"what": "worker", "since": last or started,
                        "text": f"no live worker serves the {queue} queue"
                                + (" (the last one was seen then)" if last else " (none has reported)")})
    return out


def weight_sync_points(*, run: Run) -> dict[str, Any]:
    """The weight-sync timeline for a chart: when each version was published, when each
    explorer loaded which version (unix seconds), and the versions no explorer loaded
    although a later one was (skipped)."""
    timeline = weight_sync_timeline(run=run)
    published = [[v["published_at"].timestamp(), v["number"]] for v in timeline if v["published_at"]]
    loads: dict[str, list[list[float]]] = {}
    for v in timeline:
        for load in v["loads"]:
            loads.setdefault(load["worker"], []).append([load["loaded_at"].timestamp(), v["number"]])
    loaded = {v["number"] for v in timeline if v["loads"]}
    newest_loaded = max(loaded, default=-1)
    skipped = sorted(v["number"] for v in timeline if v["number"] not in loaded and v["number"] < newest_loaded)
    return {"published": sorted(published), "loads": {w: sorted(p) for w, p in loads.items()}, "skipped": skipped}
