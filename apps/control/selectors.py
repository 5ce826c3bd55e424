"""The run pages' reads that join the kernel's runs with the buffer's experiences and the
feedback given on them (the dashboard, the runs list, the experience browser, what a run
waits for). Kernel-only reads (roles, metrics, versions) stay in apps.runs.selectors."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TypedDict
from urllib.parse import urlencode

from django.contrib.auth.models import User
from django.db.models import Count, Exists, Max, Min, OuterRef, Q, QuerySet
from django.db.models.functions import TruncMinute
from django.utils import timezone

from apps.buffer.models import Experience, Taskset
from apps.buffer.selectors import ExperienceFilters
from apps.control.conductor import batch_plan, train_readiness
from apps.feedback.models import Feedback, Person
from apps.feedback.kinds import kind_names, kinds_that_flag
from apps.feedback.handout.expiry import wait_window
from apps.feedback.handout.holds import HeldForPeople, held_for_people
from apps.feedback.handout.queue import annotation_waiting
from apps.runs import schedule
from apps.runs.heartbeat import workers_health
from apps.runs.models import AuditEntry, Metric, ModelVersion, Run, WeightLoad
from apps.runs.selectors import (
    audit_text,
    reward_sparkline,
    run_invites_annotation,
    run_role,
    runs_visible_to,
    sparkline_points,
)

EVAL_ACCURACY = "eval/accuracy"  # the held-out evaluation's accuracy metric (workers' name for it)


class LastEvent(TypedDict):
    at: datetime
    text: str


def run_last_event(*, run: Run) -> LastEvent | None:
    """The most recent thing that happened to the run: a control, a metric, a version, a
    weight load or an experience."""
    candidates: list[LastEvent] = []
    audit = AuditEntry.objects.filter(run=run).order_by("-created_at").first()
    if audit:
        candidates.append({"at": audit.created_at, "text": audit_text(action=audit.action, actor=audit.actor)})
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


# The runs table's columns one may sort by (`?sort=key`, `?sort=-key` descending), and
# what each sorts on; an unknown key falls back to the newest runs first.
RUN_SORTS: dict[str, str] = {
    "name": "name", "status": "status", "created": "created", "steps": "steps",
    "reward": "reward", "eval": "eval", "labels": "labels",
}
RUN_SORT_DEFAULT = "-created"


@dataclass(frozen=True)
class RunListQuery:
    """What the runs table shows: sorted by `sort` (a RUN_SORTS key, descending when
    `descending`), filtered to a status and to names containing `name`."""

    sort: str = "created"
    descending: bool = True
    status: str = ""
    name: str = ""

    @classmethod
    def parse(cls, params: Mapping[str, str]) -> RunListQuery:
        """From the page's query string; unknown sorts and statuses are ignored, never an error."""
        raw = str(params.get("sort", "") or RUN_SORT_DEFAULT)
        key = raw.removeprefix("-")
        if key not in RUN_SORTS:
            raw, key = RUN_SORT_DEFAULT, RUN_SORT_DEFAULT.removeprefix("-")
        status = str(params.get("status", ""))
        return cls(sort=key, descending=raw.startswith("-"),
                   status=status if status in Run.Status.values else "",
                   name=str(params.get("q", "")).strip()[:200])

    @property
    def token(self) -> str:
        return f"-{self.sort}" if self.descending else self.sort

    def params(self, **change: str) -> str:
        """The query string of this view with `change` applied (e.g. sort="name")."""
        values = {"sort": self.token, "status": self.status, "q": self.name, **change}
        if values["sort"] == RUN_SORT_DEFAULT:
            values["sort"] = ""
        return urlencode({k: v for k, v in values.items() if v})


def run_columns(query: RunListQuery) -> list[dict[str, str]]:
    """The sortable headers: each links to its sort, the opposite direction when it is the
    current one (numbers start highest first, words from A)."""
    columns = []
    for key, label in (("name", "Run"), ("status", "Status"), ("steps", "Steps"), ("reward", "Reward"),
                       ("eval", "Eval accuracy"), ("labels", "Labels"), ("created", "Created")):
        first = key if key in ("name", "status") else f"-{key}"
        if query.sort == key:
            target = key if query.descending else f"-{key}"
            arrow = "descending" if query.descending else "ascending"
        else:
            target, arrow = first, ""
        columns.append({"key": key, "label": label, "href": "?" + query.params(sort=target), "sorted": arrow})
    return columns


def _sort_value(query: RunListQuery, run: Run, *, reward: float | None, eval_accuracy: float | None,
                labels: int) -> tuple[str, float] | None:
    """What `query` sorts `run` by, as (text, number); None when the run has no such value yet."""
    numbers: dict[str, float | None] = {
        "created": run.created_at.timestamp(), "steps": float(run.train_step), "reward": reward,
        "eval": eval_accuracy, "labels": float(labels),
    }
    if query.sort == "name":
        return (run.name.lower(), float(run.pk))
    if query.sort == "status":
        return (run.status, float(run.pk))
    number = numbers[query.sort]
    return None if number is None else ("", number)


class RunRow(TypedDict):
    """One line of the runs list."""

    run: Run
    role: str | None
    annotate: bool
    waiting: int
    counts: dict[str, int]
    spark: list[float]
    spark_points: str
    reward: float | None
    eval_accuracy: float | None
    labels: int
    last_event: LastEvent | None


def run_rows(*, user: Person, query: RunListQuery | None = None) -> list[RunRow]:
    """The runs list: each visible run with its buffer counts, reward sparkline, latest
    evaluation accuracy, labels given and last event; sorted and filtered by `query`."""
    query = query or RunListQuery()
    visible = runs_visible_to(user=user).select_related("owner")
    if query.status:
        visible = visible.filter(status=query.status)
    if query.name:
        visible = visible.filter(name__icontains=query.name)
    runs = list(visible)
    ids = [r.pk for r in runs]
    evals = dict(Metric.objects.filter(run__in=ids, name=EVAL_ACCURACY).order_by("run_id", "-step", "-id")
                 .distinct("run_id").values_list("run_id", "value"))
    labels = dict(Feedback.objects.filter(run__in=ids, kind__in=kind_names(labels=True)).order_by()
                  .values("run_id").annotate(n=Count("id")).values_list("run_id", "n"))
    counts: dict[int, dict[str, int]] = {run.pk: dict.fromkeys(Experience.Status.values, 0) for run in runs}
    for row in (
        Experience.objects.filter(run__in=[r.pk for r in runs]).values("run_id", "status").annotate(n=Count("id"))
    ):
        counts[row["run_id"]][row["status"]] = row["n"]
    rows: list[RunRow] = []
    keys: dict[int, tuple[str, float]] = {}
    for run in runs:
        spark = reward_sparkline(run=run)
        role = run_role(run=run, user=user)
        # "Annotate" only where people's labels still count (not on an auto, finished or failed run).
        annotate = role in ("owner", "annotator") and run_invites_annotation(run=run)
        rows.append({
            "run": run,
            "role": role,
            "annotate": annotate,
            "waiting": annotation_waiting(run=run, annotator=user) if annotate else 0,
            "counts": counts[run.pk],
            "spark": spark,
            "spark_points": sparkline_points(spark),
            "reward": spark[-1] if spark else None,
            "eval_accuracy": evals.get(run.pk),
            "labels": labels.get(run.pk, 0),
            "last_event": run_last_event(run=run),
        })
        value = _sort_value(query, run, reward=spark[-1] if spark else None, eval_accuracy=evals.get(run.pk),
                            labels=labels.get(run.pk, 0))
        if value is not None:
            keys[len(rows) - 1] = value
    # Runs without the value (no metric yet) come last either way.
    order = sorted(keys, key=lambda i: keys[i], reverse=query.descending)
    return [rows[i] for i in order] + [row for i, row in enumerate(rows) if i not in keys]


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


def tasksets_for(*, user: Person | None) -> list[Taskset]:
    """Tasksets a user may start a run on: their own, and those of runs they own (all for
    staff), newest first, with their task counts."""


    if not isinstance(user, User) or not user.is_authenticated:
        return []
    qs = Taskset.objects.all() if user.is_staff else Taskset.objects.filter(Q(owner=user) | Q(runs__owner=user)).distinct()
    qs = qs.exclude(import_status=Taskset.Import.FAILED)
    return list(qs.annotate(n_tasks=Count("tasks", distinct=True)).order_by("-created_at", "-id")[:200])


class Waiting(TypedDict):
    """What a running run waits for (`what`: people, version, batch, held, worker), since when."""

    what: str
    since: datetime
    text: str


def run_waiting(*, run: Run) -> list[Waiting]:
    """What a running run waits for, and since when: people's feedback, a model version
    from the trainer, a full batch, a worker for a queue. Empty when nothing holds it up."""


    if run.status != Run.Status.RUNNING:
        return []
    cfg = run.cfg
    out: list[Waiting] = []
    started = (AuditEntry.objects.filter(run=run, action__in=("start", "resume")).aggregate(t=Max("created_at"))["t"]
               or run.updated_at)
    latest_version = ModelVersion.objects.filter(run=run).aggregate(t=Max("created_at"))["t"] or started

    people = _people_wait(run=run) if cfg.feedback.mode != "auto" else None
    if people is not None:
        out.append(people)
    if schedule.explores(cfg) and run.explore_step < cfg.total_steps:
        k = run.explore_step + 1
        if schedule.explore_version(cfg=cfg, explore_step=k, current_version=run.current_version) is None:
            need = schedule.version_required(cfg=cfg, explore_step=k)
            out.append({"what": "version", "since": latest_version,
                        "text": f"the explorer waits for model v{need} from the trainer before explore step {k} "
                                f"(now v{run.current_version}; {cfg.mode}, max staleness {cfg.max_staleness})"})
    if schedule.trains(cfg) and run.train_step < cfg.total_steps:
        readiness = train_readiness(run=run)
        if not readiness.ready and not readiness.final:
            plan = batch_plan(cfg=cfg)
            out.append({"what": "batch", "since": latest_version,
                        "text": f"the trainer waits for a full batch for step {run.train_step + 1}: "
                                f"{readiness.usual} of {plan.usual} trainable experiences"
                                + (f", {readiness.expert} of {plan.expert} expert" if plan.expert else "")})
            held = held_for_people(run=run)
            if held is not None:
                out.append(_held_wait(held))
    health = workers_health()
    for queue, needed in (("rollout", schedule.explores(cfg) and run.explore_step < cfg.total_steps),
                          ("train", schedule.trains(cfg) and run.train_step < cfg.total_steps)):
        if not needed:
            continue
        serving = [w for w in health if queue in (w["beat"].queues or [])]
        if not any(w["state"] in ("idle", "busy") for w in serving):
            last = max((w["beat"].last_seen for w in serving), default=None)
            out.append({"what": "worker", "since": last or started,
                        "text": f"no live worker serves the {queue} queue"
                                + (" (the last one was seen then)" if last else " (none has reported)")})
    return out


def _people_wait(*, run: Run) -> Waiting | None:
    """The groups that wait for people's feedback, and when the oldest follows the fallback:
    its wait window as the sweep ends it (apps.feedback.handout.expiry.wait_window, its hold
    included). None when no group waits."""
    pending = Experience.objects.filter(run=run, status=Experience.Status.PENDING, is_expert=False)
    oldest = (pending.values("group_id").annotate(since=Min("created_at"), held=Max("held_until"))
              .order_by("since", "group_id").first())
    if oldest is None:
        return None
    groups = pending.values("group_id").distinct().count()
    window = wait_window(run=run)
    fallback_at = window.ends(since=oldest["since"], held_until=oldest["held"])
    then = "then trains on the automatic reward" if run.cfg.feedback.fallback == "auto" else "then is dropped"
    if window.unheld < window.longest:
        rule = (f"learned, until the reward model passes its gate: {window.unheld:g} s unless a person holds it, "
                f"{window.longest:g} s at most")
    else:
        rule = f"{window.longest:g} s wait"
    return {"what": "people", "since": oldest["since"],
            "text": f"{groups} group{'s' if groups != 1 else ''} wait for people's feedback; the oldest "
                    f"{then} at {timezone.localtime(fallback_at):%H:%M:%S} ({rule})"}


def _held_wait(held: HeldForPeople) -> Waiting:
    """Training waits on groups held for the people who have them open (issue 64 item 9: the
    loop stalled 90 s and no page said why): which people, how many, and until when."""
    who = ", ".join(f"{name} {n}" for name, n in held.people.items()) or "nobody now"
    return {"what": "held", "since": held.since,
            "text": f"{held.groups} group{'s' if held.groups != 1 else ''} ready to train "
                    f"({held.experiences} experiences) {'are' if held.groups != 1 else 'is'} held for people who "
                    f"have {'them' if held.groups != 1 else 'it'} open ({who}); the holds end by "
                    f"{timezone.localtime(held.ends):%H:%M:%S} unless they keep working, by "
                    f"{timezone.localtime(held.latest):%H:%M:%S} at the latest"}


def _experiences_matching(*, run: Run, filters: ExperienceFilters) -> QuerySet[Experience]:
    qs = Experience.objects.filter(run=run)
    if filters.q:
        # Postgres ILIKE over the run's rows (the run filter goes first); a label's comment too.
        commented = Exists(Feedback.objects.filter(experience=OuterRef("pk"), comment__icontains=filters.q))
        qs = qs.filter(Q(prompt_text__icontains=filters.q) | Q(response_text__icontains=filters.q) | commented)
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
        # A flag the owner rejected on the review page flags nothing (apps.feedback.review.services).
        flagged = Exists(Feedback.objects.effective().filter(experience=OuterRef("pk"), kind__in=kinds_that_flag()))
        qs = qs.filter(flagged) if filters.flagged == "yes" else qs.exclude(flagged)
    return qs


def experiences_browse(*, run: Run, filters: ExperienceFilters, limit: int = 50) -> list[Experience]:
    """One page of the run's experiences matching `filters`, newest first."""
    qs = _experiences_matching(run=run, filters=filters)
    if filters.before is not None:
        qs = qs.filter(pk__lt=filters.before)
    qs = qs.annotate(
        n_feedback=Count("feedback", distinct=True),
        is_flagged=Exists(Feedback.objects.effective().filter(experience=OuterRef("pk"), kind__in=kinds_that_flag())),
    ).select_related("task")
    return list(qs.order_by("-id")[:limit])


def experiences_matching_ids(*, run: Run, filters: ExperienceFilters, limit: int) -> list[int]:
    """Every experience matching `filters` on any page (the bulk actions' "all matching"), at
    most `limit` + 1 ids, newest first (one more than the limit says it was passed)."""
    qs = _experiences_matching(run=run, filters=filters)
    return list(qs.order_by("-id").values_list("pk", flat=True)[: limit + 1])


def experiences_matching_count(*, run: Run, filters: ExperienceFilters) -> int:
    return _experiences_matching(run=run, filters=filters).count()


class GroupMember(TypedDict):
    exp: Experience
    feedback: list[Feedback]
    best: bool


def experience_group_detail(*, run: Run, group_id: str) -> list[GroupMember]:
    """A group's members side by side: each with its rewards and its feedback."""
    members = list(Experience.objects.filter(run=run, group_id=group_id).select_related("task").order_by("id"))
    feedback: dict[int | None, list[Feedback]] = {}
    for fb in Feedback.objects.filter(run=run, experience__in=members).select_related("author").order_by("created_at"):
        feedback.setdefault(fb.experience_id, []).append(fb)
    rewards = [m.reward for m in members if m.reward is not None]
    best = max(rewards) if rewards else None
    return [{"exp": m, "feedback": feedback.get(m.pk, []), "best": best is not None and m.reward == best} for m in members]


def whole_group_feedback(*, run: Run, group_id: str) -> list[Feedback]:
    """Feedback on the group as a whole (rankings), not on one member."""
    return list(Feedback.objects.filter(run=run, group_id=group_id, experience__isnull=True).select_related("author"))
