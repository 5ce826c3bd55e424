"""A run's summary once it ended (finished, failed or stopped): how long it ran, how far it
got, how its main metrics moved, who labelled what, and its best version, whose weights the
page offers as a download (apps/control/weights.py). A read: no writes."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db.models import Count, Max

from apps.control.weights import WeightsExport, weights_export_state
from apps.feedback.kinds import kind_names
from apps.feedback.ledger import RunLedger, run_ledger
from apps.feedback.models import Feedback
from apps.rewards.models import RewardModel
from apps.runs.models import AuditEntry, ModelVersion, Run
from apps.runs.selectors import EvalBasis, MetricMove, eval_basis, eval_best, eval_measures, metric_moves

# The statuses a summary is shown for: nothing runs any more.
SUMMARY_STATUSES = (Run.Status.FINISHED, Run.Status.FAILED, Run.Status.STOPPED)
# The run's main metrics, in the order people read them: what the explorer was rewarded, what
# people rated (the human reward of trained batches), the reward model's accuracy; then every
# series the held-out evaluation measured (accuracy by the domain's verifier, format share,
# reward, each preference share: kernel/eval_series.py), each under what it measures.
MAIN_METRICS: tuple[tuple[str, str], ...] = (
    ("explore/reward_mean", "reward (explored)"),
    ("reward_mean", "reward (trained batches)"),
    ("feedback/human_reward_mean", "people's ratings (human reward)"),
    ("reward_model/accuracy", "reward model accuracy"),
)


@dataclass(frozen=True)
class Labeller:
    who: str
    total: int  # labels (the kinds the ledger counts): what the ledger's per-person total says
    kinds: dict[str, int]  # labels by kind
    others: dict[str, int] = field(default_factory=dict)  # other feedback (flags): not labels


@dataclass(frozen=True)
class BestVersion:
    number: int
    # Why this one: the held-out evaluation's best by the metric that chose it (`metric`,
    # the run's eval.best_by), or the last one published (metric "").
    reason: str
    train_step: int
    # None for version 0: the starting model, which `cfg.model` names, has no weights to pack.
    export: WeightsExport | None
    metric: str = ""


@dataclass(frozen=True)
class RunSummary:
    status: str
    error: str
    started_at: datetime | None
    ended_at: datetime | None
    explore_step: int
    train_step: int
    total_steps: int
    versions: int
    metrics: list[MetricMove]
    labels: dict[str, int]  # labels by kind (summing to the ledger's total)
    labellers: list[Labeller]
    best: BestVersion | None
    reward_models: list[int] = field(default_factory=list)
    # Feedback that is no label (flags, an environment's rewards) by kind: counted apart, so
    # the labels figure is the ledger's total (issue 64 item 1: the summary said 48, the ledger 47).
    other_feedback: dict[str, int] = field(default_factory=dict)
    # Where each label went (apps/feedback/ledger.py), in all and per person.
    ledger: RunLedger | None = None
    # What the held-out figures count (tasks, samples, greedy or sampled); None without any.
    basis: EvalBasis | None = None

    @property
    def duration(self) -> timedelta | None:
        if self.started_at is None or self.ended_at is None:
            return None
        return self.ended_at - self.started_at

    @property
    def labels_total(self) -> int:
        return sum(self.labels.values())


def _metric_moves(run: Run) -> list[MetricMove]:
    """The main metrics, then every measuring evaluation series the run recorded."""
    return metric_moves(run=run, metrics=[*MAIN_METRICS, *eval_measures(run=run)])


def _labellers(run: Run) -> tuple[dict[str, int], dict[str, int], list[Labeller]]:
    """The run's labels by kind, its other feedback by kind, and who gave what."""
    labelling = set(kind_names(labels=True))
    kinds: dict[str, int] = {}
    others: dict[str, int] = {}
    people: dict[str, tuple[dict[str, int], dict[str, int]]] = {}
    rows = (Feedback.objects.filter(run=run).values("kind", "author__username", "api_key__name")
            .annotate(n=Count("id")).order_by())
    for row in rows:
        kind, n = str(row["kind"]), int(row["n"])
        label = kind in labelling
        into = kinds if label else others
        into[kind] = into.get(kind, 0) + n
        who = row["author__username"] or (f"API key “{row['api_key__name']}”" if row["api_key__name"] else "someone")
        by = people.setdefault(who, ({}, {}))[0 if label else 1]
        by[kind] = by.get(kind, 0) + n
    labellers = [Labeller(who=who, total=sum(k.values()), kinds=dict(sorted(k.items())), others=dict(sorted(o.items())))
                 for who, (k, o) in people.items()]
    labellers.sort(key=lambda lab: (-lab.total, lab.who))
    return _by_count(kinds), _by_count(others), labellers


def _by_count(kinds: dict[str, int]) -> dict[str, int]:
    return dict(sorted(kinds.items(), key=lambda kv: (-kv[1], kv[0])))


def _best_version(run: Run) -> BestVersion | None:
    """The run page's best version (apps.runs.selectors.eval_best, the one rule: highest held-out
    value of the run's metric, earliest on ties), version 0 included; the last version
    published where no evaluation chose one."""
    best = eval_best(run=run)
    if best is not None:
        number = int(best["version"])
        reason = f"highest held-out {best['label']} ({best['value']:.3f}); chosen by {best['metric']} ({best['how']})"
        if number == 0:
            reason += "; no trained version did better than the starting model"
        metric = best["metric"]
    else:
        number = run.current_version
        reason = "the last version published (no held-out evaluation chose one)"
        metric = ""
    if number == 0:
        # The starting model: chosen by an evaluation, else no version was published at all.
        return BestVersion(number=0, reason=reason, train_step=0, metric=metric, export=None) if best else None
    version = ModelVersion.objects.filter(run=run, number=number).first()
    if version is None:
        return None
    return BestVersion(number=number, reason=reason, train_step=version.train_step, metric=metric,
                       export=weights_export_state(run=run, version=number))


def run_summary(*, run: Run) -> RunSummary | None:
    """The summary of an ended run, None while it is a draft, running or paused."""
    if run.status not in SUMMARY_STATUSES:
        return None
    audit = AuditEntry.objects.filter(run=run)
    started = audit.filter(action="start").order_by("created_at").values_list("created_at", flat=True).first()
    ended = (audit.filter(action__in=("finish", "fail", "stop")).aggregate(t=Max("created_at"))["t"]
             or run.updated_at)
    labels, others, labellers = _labellers(run)
    return RunSummary(
        status=run.status, error=run.error, started_at=started, ended_at=ended if started else None,
        explore_step=run.explore_step, train_step=run.train_step, total_steps=run.cfg.total_steps,
        versions=ModelVersion.objects.filter(run=run, number__gt=0).count(),
        metrics=_metric_moves(run), labels=labels, labellers=labellers, best=_best_version(run),
        reward_models=list(RewardModel.objects.filter(run=run).order_by("version").values_list("version", flat=True)),
        ledger=run_ledger(run=run), basis=eval_basis(run=run), other_feedback=others,
    )
