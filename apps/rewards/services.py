"""Folding remotely scored reward parts into experiences, and handing experiences to the
reward queue."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeVar

from django.db import transaction

from apps.buffer.models import Experience
from apps.rewards.scoring import reward_combine
from kernel.fold import experience_initial_fields
from apps.runs.metrics import metric_record
from apps.rewards.models import VersionedScorer
from apps.runs.models import Run
from rftweb.celery import app

Scorer = TypeVar("Scorer", bound=VersionedScorer)

SCORE_TASK = "workers.reward.scoring.score_experiences"


def rewards_remote_enqueue(*, run_id: int, experience_ids: Sequence[int]) -> None:
    """Queue remote scoring of experiences once the transaction that wrote them commits."""
    if not experience_ids:
        return

    ids = [int(i) for i in experience_ids]
    transaction.on_commit(lambda: app.send_task(SCORE_TASK, args=[run_id, ids], queue="reward"))


def experience_rewards_apply(
    *,
    run: Run,
    scored: Mapping[int, Mapping[str, float]],
    errors: Mapping[int, Mapping[str, str]] | None = None,
    reasons: Mapping[int, Mapping[str, str]] | None = None,
) -> list[int]:
    """Merge remote reward parts into experiences still awaiting them, in one transaction.

    For each: parts merged into `reward_parts`, `auto_reward` recomputed over all parts,
    `metadata["awaiting_rewards"]` cleared, and, while the experience is still pending,
    status and reward set by the run's feedback settings (auto → ready with the reward;
    blend/human → stays pending for people). Rows are locked and re-checked, so a second
    worker scoring the same experiences applies nothing. A scorer's reasons (the K-12
    judge's) go to `metadata["reward_reasons"]` by term key. Returns the ids applied.
    """
    if not scored:
        return []
    cfg = run.cfg
    errors = errors or {}
    reasons = reasons or {}
    applied: list[int] = []
    with transaction.atomic():
        rows = Experience.objects.select_for_update().filter(run=run, pk__in=list(scored)).order_by("pk")
        for exp in rows:
            metadata = dict(exp.metadata or {})
            if not metadata.get("awaiting_rewards"):
                continue
            parts = {**(exp.reward_parts or {}), **{k: float(v) for k, v in scored[exp.pk].items()}}
            auto = reward_combine(terms=cfg.rewards, parts=parts)
            metadata["awaiting_rewards"] = []
            if errors.get(exp.pk):
                metadata["reward_errors"] = dict(errors[exp.pk])
            if reasons.get(exp.pk):
                metadata["reward_reasons"] = {**metadata.get("reward_reasons", {}), **reasons[exp.pk]}
            update: dict[str, object] = {"reward_parts": parts, "auto_reward": auto, "metadata": metadata}
            if exp.status == Experience.Status.PENDING:
                fields = experience_initial_fields(cfg=cfg, auto_reward=auto)
                update["status"], update["reward"] = fields["status"], fields["reward"]
            Experience.objects.filter(pk=exp.pk).update(**update)
            applied.append(exp.pk)
    return applied


def scorer_publish(*, model: type[Scorer], run: Run, metric: str, accuracy: float | None,
                   more_metrics: dict[str, float | None] | None = None, **fields: object) -> Scorer:
    """Record a trained scorer (a VersionedScorer: the learned reward model, the K-12 grader)
    as the run's next version; its held-out accuracy (and `more_metrics`, where not None) goes
    through metric_record, the one path to the run page's chart, the live event and the run's
    experiment trackers."""
    from django.db import IntegrityError
    from django.db.models import Max

    for _ in range(5):
        number = (model._default_manager.filter(run=run).aggregate(m=Max("version"))["m"] or 0) + 1
        try:
            with transaction.atomic():
                scorer = model._default_manager.create(run=run, version=number, accuracy=accuracy, **fields)
                values = {name: value for name, value in {metric: accuracy, **(more_metrics or {})}.items()
                          if value is not None}
                if values:
                    metric_record(run=run, step=number, values=values)
            return scorer
        except IntegrityError:
            continue  # another worker published this number first: take the next
    raise RuntimeError(f"could not number a {model._meta.verbose_name} of run {run.pk}")
