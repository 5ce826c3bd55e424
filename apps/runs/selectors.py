"""Reads of runs, and who may see what."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import TypedDict

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser, User
from django.db.models import Q, QuerySet

from kernel.algorithms import algorithm_get
from kernel.config import line_ends_normalise
from kernel.eval_series import (ACCURACY, BEST_BY_FIXED, PREFERENCE, PREFIX, basis_words, best_by_metric, change_interval,
                                change_words, is_eval_measure,
                                is_share, metric_label, sampling_words, share_interval)
from apps.runs.heartbeat import WorkerHealth, workers_health
from apps.runs.models import AuditEntry, Metric, ModelVersion, Run, RunMember, SyncFailure, TaskFailure, WeightLoad
from kernel.jsontypes import JSON


def _is_staff(user: AbstractBaseUser | AnonymousUser) -> bool:
    # Staff is a field of Django's User, not of the abstract base that request.user is typed as.
    return bool(getattr(user, "is_staff", False))


def runs_visible_to(*, user: AbstractBaseUser | AnonymousUser) -> QuerySet[Run]:
    if not user.is_authenticated:
        return Run.objects.none()
    if _is_staff(user):
        return Run.objects.all()
    return Run.objects.filter(Q(owner=user) | Q(members__user=user)).distinct()


def runs_to_compare(*, user: AbstractBaseUser | AnonymousUser, run: Run, limit: int = 50) -> list[dict[str, int | str]]:
    """The runs `user` may compare `run` with on its charts: visible ones with metrics (a run
    that failed before its first step has nothing to draw), newest first."""
    others = (runs_visible_to(user=user).exclude(pk=run.pk)
              .filter(pk__in=Metric.objects.values("run_id")).order_by("-created_at"))
    return [{"id": r.pk, "name": r.name, "status": r.status} for r in others[:limit]]


def run_role(*, run: Run, user: AbstractBaseUser | AnonymousUser) -> str | None:
    """'owner' (owner or staff), 'annotator', 'viewer', or None for no access."""
    if not user.is_authenticated:
        return None
    if _is_staff(user) or run.owner_id == user.pk:
        return "owner"
    return RunMember.objects.filter(run=run, user_id=user.pk).values_list("role", flat=True).first()


def run_can_view(*, run: Run, user: AbstractBaseUser | AnonymousUser) -> bool:
    return run_role(run=run, user=user) is not None


# A finished run has nothing left to train, and a stopped or failed one trains nothing until
# someone starts it again (its held groups were released, its labels read "unused: the run
# ended"): none takes people's feedback, so no page, list or API invites it, and no label on
# it is withdrawn or revised either (issue 64 item 7: one rule for rating, Undo, Revise and
# the queue). Started again, it takes labels again.
ENDED_STATUSES = (Run.Status.FINISHED, Run.Status.FAILED, Run.Status.STOPPED)

_CLOSED_WHY = {
    Run.Status.FINISHED: "its training is done",
    Run.Status.FAILED: "it trains nothing until its owner starts it again",
    Run.Status.STOPPED: "it trains nothing until its owner starts it again",
}


def run_takes_feedback(*, run: Run) -> bool:
    """Whether the run takes feedback: it can still change something (the run has not ended)
    and people are meant to give it (a twin is its run without people by construction). Every
    door refuses it otherwise (apps.feedback.kinds.submit.FeedbackClosed says which)."""
    return run.status not in ENDED_STATUSES and run.twin_of_id is None


def run_feedback_closed_reason(*, run: Run) -> str:
    """Why a run takes no feedback, in a few words ("" while it takes feedback)."""
    if run_takes_feedback(run=run):
        return ""
    if run.twin_of_id is not None:
        return f"it is the twin of run {run.twin_of_id}, without people"
    return _CLOSED_WHY.get(Run.Status(run.status), "it has ended")


def run_feedback_closed_why(*, run: Run) -> str:
    """The refusal of a label on the run, as every door says it ("" while it takes feedback):
    the rating, Undo and Revise, the API, the CLI and the closed queue give the same reason."""
    if run.twin_of_id is not None:
        return (f"run {run.pk} is the twin of run {run.twin_of_id}: it takes no labels, so that the difference "
                "between the two runs is what people taught")
    reason = run_feedback_closed_reason(run=run)
    return f"run {run.pk} is {run.status}: it takes no more feedback ({reason})" if reason else ""


def run_invites_annotation(*, run: Run) -> bool:
    """Whether pages offer "Annotate" on the run: it takes feedback and people's labels
    count (feedback settings that fold them, a reward model learning from them, or an algorithm
    that trains on people's corrections). An `auto` run with none of these trains on the
    reward functions alone."""
    if not run_takes_feedback(run=run):
        return False
    cfg = run.cfg
    return (cfg.feedback.mode != "auto" or cfg.reward_model.enabled
            or algorithm_get(cfg.algorithm).batch_plan(cfg).expert > 0)


class VisibleWorker(WorkerHealth):
    tasks: list[dict[str, object]]  # {"name", "run_id", "started_at"} of the runs the user sees
    hidden: int  # how many of its tasks are of other runs


def workers_visible(*, user: AbstractBaseUser | AnonymousUser, run: Run | None = None) -> list[VisibleWorker]:
    """Worker health as `user` may see it: every worker's state, but of the tasks it runs
    only those of runs the user may see (of `run` alone when given), by name and run, never
    their arguments; the rest are counted as `hidden`."""
    visible = {run.pk} if run is not None else set(runs_visible_to(user=user).values_list("pk", flat=True))
    rows: list[VisibleWorker] = []
    for row in workers_health():
        tasks: list[dict[str, object]] = [{"name": t.get("name", ""), "run_id": t.get("run_id"), "started_at": t.get("started_at")}
                 for t in row["beat"].active if t.get("run_id") in visible]
        rows.append({**row, "tasks": tasks, "hidden": len(row["beat"].active) - len(tasks)})
    return rows


# --- the dashboard's reads -------------------------------------------------------------

# Charts of the run page, by pattern: metrics go to the first chart whose pattern matches their name
# (the browser applies the same patterns to metrics that arrive live); the rest get a chart
# each. Names are whatever the explorer and trainer record through `metric_record`.
CHARTS: list[dict[str, str]] = [
    {"id": "reward", "title": "Reward mean / std", "section": "rewards", "pattern": r"^(reward|rewards?)([/_.](mean|std|avg|max|min))?$"},
    {"id": "accuracy", "title": "Accuracy per domain", "section": "rewards", "pattern": r"^acc(uracy)?([/_.].*)?$"},
    # The shares of held-out answers each measured preference of style likes (eval.preferences,
    # kernel/preferences.py): what people teach, charted apart from the reward they are not.
    {"id": "preference", "title": "Preferences people teach (share of held-out answers)", "section": "rewards",
     "pattern": r"^eval[/_.]preference[/_.]"},
    # The evaluator's scores (workers/explore/evaluation.py); its response length charts with the
    # training one, its version / task count / best version are constants, its seconds "other".
    {"id": "eval", "title": "Held-out evaluation", "section": "rewards", "pattern": r"^eval[/_.](.*[/_.])?(reward|acc|accuracy|score|pass|correct|format|positive)([/_.@].*)?$"},
    {"id": "loss", "title": "Loss", "section": "loss", "pattern": r"(^|[/_.])loss([/_.].*)?$"},
    {"id": "kl", "title": "KL", "section": "loss", "pattern": r"(^|[/_.])kl([/_.].*)?$"},
    {"id": "entropy", "title": "Entropy", "section": "loss", "pattern": r"entropy"},
    {"id": "clip", "title": "Clip fraction", "section": "loss", "pattern": r"clip"},
    {"id": "length", "title": "Response length", "section": "throughput", "pattern": r"(response|completion)[/_.]?len(gth)?|^len(gth)?([/_.].*)?$"},
    {"id": "throughput", "title": "Tokens / s", "section": "throughput", "pattern": r"tokens?[/_.]?(per[/_.]?s(ec(ond)?)?|/s|_s)$|throughput"},
    {"id": "staleness", "title": "Staleness", "section": "throughput", "pattern": r"stale"},
]
# Sections of the run page's charts, in order; metrics no chart's pattern claims go to "other".
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
REWARD_SPARK_PATTERN = CHARTS[0]["pattern"]


def metric_series(*, run: Run, last_steps: int = 2000) -> dict[str, list[list[float]]]:
    """{metric name: [[step, value, unix time], ...]} over the run's last `last_steps` steps."""
    from django.db.models import Max

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


class WeightLoadRow(TypedDict):
    worker: str
    loaded_at: datetime
    seconds: float
    lag: float | None  # seconds from publication to this load (None: publication unknown)


class SyncFailureRow(TypedDict):
    method: str
    stage: str
    where: str
    worker: str
    seconds: float
    message: str
    failed_at: datetime


class VersionSync(TypedDict):
    number: int
    published_at: datetime | None
    train_step: int | None
    checkpoint: str
    loads: list[WeightLoadRow]
    failures: list[SyncFailureRow]


def weight_sync_timeline(*, run: Run) -> list[VersionSync]:
    """Per model version, newest first: when it was published, when each explorer loaded it,
    and each sync of it that failed (what, where, why)."""
    versions: dict[int, VersionSync] = {}

    def entry_of(number: int) -> VersionSync:
        return versions.setdefault(number, {"number": number, "published_at": None, "train_step": None,
                                            "checkpoint": "", "loads": [], "failures": []})

    for v in ModelVersion.objects.filter(run=run).order_by("number"):
        versions[v.number] = {"number": v.number, "published_at": v.created_at, "train_step": v.train_step,
                              "checkpoint": v.checkpoint, "loads": [], "failures": []}
    for f in SyncFailure.objects.filter(run=run).order_by("failed_at", "pk"):
        entry_of(f.version)["failures"].append({"method": f.method, "stage": f.stage, "where": f.where,
                                                "worker": f.worker, "seconds": f.seconds, "message": f.message,
                                                "failed_at": f.failed_at})
    for load in WeightLoad.objects.filter(run=run).order_by("loaded_at"):
        entry = entry_of(load.version)
        entry["loads"].append({"worker": load.worker, "loaded_at": load.loaded_at, "seconds": load.seconds,
                               "lag": (load.loaded_at - entry["published_at"]).total_seconds() if entry["published_at"] else None})
    return [versions[n] for n in sorted(versions, reverse=True)]


# How the audit log and "last event" say what happened: the past tense of the action, and
# "by <person>" only when a person did it (the system's own finish or failure says no more).
_AUDIT_WORDS = {
    "start": "started", "pause": "paused", "resume": "resumed", "stop": "stopped", "finish": "finished",
    "fail": "failed", "feedback_settings": "feedback settings changed", "member_add": "member added",
    "member_role": "member's role changed", "member_remove": "member removed", "invite": "invitation made",
    "invite_used": "invitation accepted", "invite_revoke": "invitation revoked",
    "label_accept": "label accepted", "label_reject": "label rejected",
}


def audit_text(*, action: str, actor: object = None) -> str:
    said = _AUDIT_WORDS.get(action, action.replace("_", " "))
    return f"{said} by {actor}" if actor else said


def run_audit(*, run: Run, limit: int = 50) -> list[AuditEntry]:
    return list(AuditEntry.objects.filter(run=run).select_related("actor").order_by("-created_at")[:limit])

@dataclass(frozen=True)
class MetricMove:
    """A metric from the run's first value to its last, and its best (highest) value. For an
    evaluation share (accuracy, a preference): the tasks each end was counted on and its 95%
    interval (kernel.eval_series.share_interval)."""

    name: str
    label: str
    start: float
    end: float
    best: float
    best_step: int
    points: int
    start_step: int = 0
    end_step: int = 0
    start_tasks: int | None = None
    end_tasks: int | None = None

    @property
    def change(self) -> float:
        return self.end - self.start

    @property
    def start_interval(self) -> tuple[float, float] | None:
        return share_interval(self.start, self.start_tasks) if is_share(self.name) and self.start_tasks else None

    @property
    def end_interval(self) -> tuple[float, float] | None:
        return share_interval(self.end, self.end_tasks) if is_share(self.name) and self.end_tasks else None

    @property
    def change_interval(self) -> tuple[float, float] | None:
        """A share's change, start to end, with its 95% interval over both evaluations' tasks."""
        if not (is_share(self.name) and self.start_tasks and self.end_tasks and self.points > 1):
            return None
        return change_interval(self.start, self.start_tasks, self.end, self.end_tasks)

    @property
    def change_words(self) -> str:
        """"rose", "fell" or "no clear change" for a share with tasks counted; "" otherwise."""
        interval = self.change_interval
        return change_words(interval) if interval else ""


# The evaluation's series first in this order, the rest (preference shares) by name.
_EVAL_ORDER = ("eval/accuracy", "eval/format_share", "eval/reward_mean", "eval/reward_std", "eval/positive_share")
TASKS_METRIC = f"{PREFIX}tasks"


def eval_measures(*, run: Run) -> list[tuple[str, str]]:
    """(name, words) of every evaluation series the run recorded that measures the answers:
    accuracy by the domain's verifier, format share, reward, each preference share."""
    recorded = set(Metric.objects.filter(run=run, name__startswith="eval/").values_list("name", flat=True).distinct())
    names = sorted((n for n in recorded if is_eval_measure(n)),
                   key=lambda n: (_EVAL_ORDER.index(n) if n in _EVAL_ORDER else len(_EVAL_ORDER), n))
    return [(n, metric_label(n)) for n in names]


def metric_moves(*, run: Run, metrics: list[tuple[str, str]]) -> list[MetricMove]:
    """Each of `metrics` (name, words) the run recorded: first, last and best value, and for
    an evaluation series the tasks its first and last evaluations counted."""
    series: dict[str, list[tuple[int, float]]] = {}
    names = [n for n, _ in metrics]
    if any(n.startswith(PREFIX) for n in names):
        names.append(TASKS_METRIC)
    for name, step, value in (Metric.objects.filter(run=run, name__in=names)
                              .order_by("name", "step", "id").values_list("name", "step", "value")):
        series.setdefault(name, []).append((step, value))
    tasks = dict(series.get(TASKS_METRIC, []))
    out = []
    for name, label in metrics:
        points = series.get(name)
        if not points:
            continue
        best_step, best = max(points, key=lambda p: (p[1], -p[0]))
        (first, start), (last, end) = points[0], points[-1]
        out.append(MetricMove(name=name, label=label, start=start, end=end, best=best, best_step=best_step,
                              points=len(points), start_step=first, end_step=last,
                              start_tasks=int(tasks[first]) if first in tasks else None,
                              end_tasks=int(tasks[last]) if last in tasks else None))
    return out


class EvalBasis(TypedDict):
    """What the run's held-out figures count: tasks (the newest evaluation's), answers per
    task, greedy or sampled, in words ("64 tasks × 2 samples, sampled at temperature 1")."""

    tasks: int
    samples: int
    greedy: bool
    temperature: float
    words: str
    # How each task was answered, without the task count ("2 samples a task, sampled at temperature 1").
    sampling: str


def eval_basis(*, run: Run, tasks: int | None = None) -> EvalBasis | None:
    """The run's evaluation basis: the config's samples and sampling, and `tasks` (else the
    newest evaluation's task count); None before any evaluation recorded its tasks."""
    if tasks is None:
        newest = (Metric.objects.filter(run=run, name=TASKS_METRIC).order_by("-step", "-id")
                  .values_list("value", flat=True).first())
        if newest is None:
            return None
        tasks = int(newest)
    ev = run.cfg.eval
    temperature = ev.sampling.temperature
    return {"tasks": tasks, "samples": ev.n, "greedy": temperature == 0, "temperature": temperature,
            "words": basis_words(tasks=tasks, samples=ev.n, temperature=temperature),
            "sampling": sampling_words(samples=ev.n, temperature=temperature)}


class EvalBest(TypedDict):
    """The run's best evaluated version and what chose it."""

    version: int
    step: int
    # The metric that chose it (eval.best_by, kernel/eval_series.py), its words, its value.
    metric: str
    label: str
    value: float
    # Whether the config named the metric (else picked on the page, or the default).
    configured: bool
    # How the metric was chosen, in words.
    how: str


def taught_preference(*, run: Run) -> str | None:
    """The preference the run's guidelines teach: the first of `eval.preferences` where the
    run has guidelines (the demo's `working`); None without either."""
    cfg = run.cfg
    return cfg.eval.preferences[0] if cfg.feedback.guidelines.strip() and cfg.eval.preferences else None


def best_by_options(*, run: Run) -> list[tuple[str, str]]:
    """(metric, words) a best version may be chosen by on the run's pages: the series the run
    recorded among accuracy, format share, reward mean and its preferences, the taught
    preference first where the run has guidelines, accuracy first otherwise."""
    recorded = dict(eval_measures(run=run))
    taught = taught_preference(run=run)
    first = [f"{PREFIX}{PREFERENCE}{taught}"] if taught else []
    names = [*first, *(f"{PREFIX}{n}" for n in BEST_BY_FIXED), *(n for n in recorded if n.startswith(PREFIX + PREFERENCE))]
    return [(n, recorded[n]) for n in dict.fromkeys(names) if n in recorded]


def eval_metric_values(*, run: Run, metric: str) -> dict[int, tuple[int, float]]:
    """{version: (step, value of `metric`)} for every evaluated version."""
    values = dict(Metric.objects.filter(run=run, name=metric).values_list("step", "value"))
    versions = dict(Metric.objects.filter(run=run, name=f"{PREFIX}version").values_list("step", "value"))
    return {int(versions.get(step, 0)): (step, value) for step, value in sorted(values.items())}


def eval_best(*, run: Run, metric: str | None = None) -> EvalBest | None:
    """The evaluated version with the highest value of `metric` (the earliest on ties), or
    None before any evaluation (or while the metric has no value). `metric`: one the owner
    picked on the page (one of best_by_options); None: the run's `eval.best_by`, else the
    taught preference where the run has guidelines (kernel.eval_series.best_by_metric)."""
    best_by = run.cfg.eval.best_by
    if metric is not None:
        name, how = metric, "picked on this page"
    else:
        taught = taught_preference(run=run) if best_by is None else None
        candidates = [f"{PREFIX}{ACCURACY}", *([f"{PREFIX}{PREFERENCE}{taught}"] if taught else [])]
        recorded = set() if best_by is not None else set(
            Metric.objects.filter(run=run, name__in=candidates).values_list("name", flat=True).distinct())
        taught = taught if f"{PREFIX}{PREFERENCE}{taught}" in recorded else None
        name = best_by_metric(best_by, has_accuracy=f"{PREFIX}{ACCURACY}" in recorded, taught=taught)
        how = ("eval.best_by" if best_by is not None else "the default: the share the guidelines teach" if taught
               else "the default: accuracy where the domain has a verifier, else reward")
    values = dict(Metric.objects.filter(run=run, name=name).values_list("step", "value"))
    if not values:
        return None
    versions = dict(Metric.objects.filter(run=run, name=f"{PREFIX}version").values_list("step", "value"))
    step = max(sorted(values), key=lambda s: values[s])
    return {"version": int(versions.get(step, 0)), "step": step, "metric": name, "label": metric_label(name),
            "value": values[step], "configured": metric is None and best_by is not None, "how": how}


def run_task_failures(*, run: Run, limit: int = 10) -> list[TaskFailure]:
    """The run's last failed explore and train tasks, newest first."""
    return list(TaskFailure.objects.filter(run=run).order_by("-created_at", "-id")[:limit])


class RunState(TypedDict):
    status: str
    explore_step: int
    train_step: int
    total_steps: int
    version: int
    error: str


def run_state(*, run: Run) -> RunState:
    """What the run page's header shows, for its live updates."""
    return {"status": run.status, "explore_step": run.explore_step, "train_step": run.train_step,
            "total_steps": run.cfg.total_steps, "version": run.current_version, "error": run.error}


def run_may_create(*, user: User | AnonymousUser) -> bool:
    """Who sees "New run": staff, owners of a run, and anyone who is not only an annotator or
    viewer of others' runs (a fresh account owns nothing yet and may start)."""
    if not user.is_authenticated:
        return False
    if user.is_staff or Run.objects.filter(owner=user).exists():
        return True
    return not RunMember.objects.filter(user=user).exists()


def weight_sync_points(*, run: Run, timeline: list[VersionSync] | None = None) -> dict[str, object]:
    """The weight-sync timeline for a chart: when each version was published, when each
    explorer loaded which version (unix seconds), and the versions no explorer loaded
    although a later one was (skipped). `timeline`: weight_sync_timeline's, where the
    caller has read it already (the run page shows both)."""
    timeline = weight_sync_timeline(run=run) if timeline is None else timeline
    published = [[v["published_at"].timestamp(), v["number"]] for v in timeline if v["published_at"]]
    loads: dict[str, list[list[float]]] = {}
    for v in timeline:
        for load in v["loads"]:
            loads.setdefault(load["worker"], []).append([load["loaded_at"].timestamp(), v["number"]])
    loaded = {v["number"] for v in timeline if v["loads"]}
    newest_loaded = max(loaded, default=-1)
    skipped = sorted(v["number"] for v in timeline if v["number"] not in loaded and v["number"] < newest_loaded)
    return {"published": sorted(published), "loads": {w: sorted(p) for w, p in loads.items()}, "skipped": skipped}


class ConfigDifference(TypedDict):
    path: str  # dotted, e.g. "feedback.mode"
    left: str  # the value in the first run as JSON, "" when the key is absent there
    right: str
    only: str  # "left" / "right" when the key is in one run only, else ""


def config_flat(config: JSON, prefix: str = "") -> dict[str, JSON]:
    """`config` as {dotted path: leaf value}; lists are leaves (compared whole)."""
    if not isinstance(config, dict):
        return {prefix: config} if prefix else {}
    flat: dict[str, JSON] = {}
    for key, value in config.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict) and value:
            flat.update(config_flat(value, path))
        else:
            flat[path] = value
    return flat


def _as_compared(value: JSON) -> JSON:
    """A text leaf as the diff compares it: \n line endings, and no trailing newline on a
    text of several lines (Markdown reads the same). Runs copied through the form before its
    line endings were normalised hold the guidelines with \r\n and the last newline cut."""
    if not isinstance(value, str):
        return value
    text = line_ends_normalise(value)
    return text.rstrip("\n") if "\n" in text else text


def config_differences(left: JSON, right: JSON) -> list[ConfigDifference]:
    """The keys whose values differ between two run configs, sorted by path."""
    a, b = ({path: _as_compared(v) for path, v in config_flat(side).items()} for side in (left, right))
    rows: list[ConfigDifference] = []
    for path in sorted(a.keys() | b.keys()):
        shown = [json.dumps(side[path], sort_keys=True) if path in side else "" for side in (a, b)]
        if path in a and path in b and shown[0] == shown[1]:
            continue
        rows.append({
            "path": path,
            "left": shown[0],
            "right": shown[1],
            "only": "left" if path not in b else "right" if path not in a else "",
        })
    return rows
