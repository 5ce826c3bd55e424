"""The run pages' reads that join the kernel's runs with the buffer's experiences and the
feedback given on them (the dashboard, the runs list, the experience browser, what a run
waits for). Kernel-only reads (roles, metrics, versions) stay in apps.runs.selectors."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db.models import Count, Exists, Max, Min, OuterRef, Q
from django.db.models.functions import TruncMinute
from django.utils import timezone

from apps.buffer.models import Experience, Taskset
from apps.buffer.selectors import ExperienceFilters
from apps.control.orchestration import batch_plan, train_readiness
from apps.feedback.models import Assignment, Feedback
from apps.runs import policy
from apps.runs.heartbeat import workers_health
from apps.runs.models import AuditEntry, Metric, ModelVersion, Run, WeightLoad
from apps.runs.selectors import reward_sparkline, run_role, runs_visible_to, sparkline_points


def run_last_event(*, run: Run) -> dict[str, Any] | None:
    """The most recent thing that happened to the run: a control, a metric, a version, a
    weight load or an experience."""
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


    since = timezone.now() - timedelta(minutes=minutes)
    rows = (
        Feedback.objects.filter(run=run, created_at__gte=since)
        .annotate(minute=TruncMinute("created_at"))
        .values("minute")
        .annotate(n=Count("id"))
        .order_by("minute")
    )
    return [[row["minute"].timestamp(), row["n"]] for row in rows]


def annotation_waiting(*, run: Run, user: Any) -> int:
    """What waits for `user` on the run's annotation page: items leased to them, and
    completions still waiting for human feedback that they have not been handed yet."""
    leased = Assignment.objects.filter(run=run, annotator=user, status=Assignment.Status.LEASED).count()
    open_ = (Experience.objects.filter(run=run, is_expert=False, status=Experience.Status.PENDING)
             .exclude(assignments__annotator=user).count())
    return leased + open_


def tasksets_for(*, user: Any) -> list[Any]:
    """Tasksets a user may start a run on: their own, and those of runs they own (all for
    staff), newest first, with their task counts."""


    if not getattr(user, "is_authenticated", False):
        return []
    qs = Taskset.objects.all() if user.is_staff else Taskset.objects.filter(Q(owner=user) | Q(runs__owner=user)).distinct()
    return list(qs.annotate(n_tasks=Count("tasks", distinct=True)).order_by("-created_at", "-id")[:200])


def run_waiting(*, run: Run) -> list[dict[str, Any]]:
    """What a running run waits for, and since when: people's feedback, a model version
    from the trainer, a full batch, a worker for a queue. Empty when nothing holds it up."""


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


def experiences_browse(*, run: Run, filters: ExperienceFilters, limit: int = 50) -> list[Experience]:
    """One page of the run's experiences matching `filters`, newest first."""
    qs = Experience.objects.filter(run=run)
    if filters.status:
        qs = qs.filter(status=filters.status)
    if filters.reward_min is not None:
        qs = qs.filter(reward__gte=filters.reward_min)
    if filters.reward_max is not None:
        qs = qs.filter(reward__lte=filters.reward_max)
    if filters.version is not None:
        qs = qs.filter(model_version=filters.version)
    if filters.domain:
        qs = qs.filter(task__domain=filters.domain)
    if filters.annotator:
        qs = qs.filter(Exists(Feedback.objects.filter(experience=OuterRef("pk"), author__username=filters.annotator)))
    if filters.flagged:
        flagged = Exists(Feedback.objects.filter(experience=OuterRef("pk"), kind=Feedback.Kind.FLAG))
        qs = qs.filter(flagged) if filters.flagged == "yes" else qs.exclude(flagged)
    if filters.before is not None:
        qs = qs.filter(pk__lt=filters.before)
    qs = qs.annotate(
        n_feedback=Count("feedback", distinct=True),
        is_flagged=Exists(Feedback.objects.filter(experience=OuterRef("pk"), kind=Feedback.Kind.FLAG)),
    ).select_related("task")
    return list(qs.order_by("-id")[:limit])


def experience_group_detail(*, run: Run, group_id: str) -> list[dict[str, Any]]:
    """A group's members side by side: each with its rewards and its feedback."""
    members = list(Experience.objects.filter(run=run, group_id=group_id).select_related("task").order_by("id"))
    feedback: dict[int | None, list[Feedback]] = {}
    for fb in Feedback.objects.filter(run=run, experience__in=members).select_related("author").order_by("created_at"):
        feedback.setdefault(fb.experience_id, []).append(fb)
    rewards = [m.reward for m in members if m.reward is not None]
    best = max(rewards) if rewards else None
    return [{"exp": m, "feedback": feedback.get(m.pk, []), "best": best is not None and m.reward == best} for m in members]


def group_feedback(*, run: Run, group_id: str) -> list[Any]:
    """Feedback on the group as a whole (rankings)."""
    return list(Feedback.objects.filter(run=run, group_id=group_id, experience__isnull=True).select_related("author"))
