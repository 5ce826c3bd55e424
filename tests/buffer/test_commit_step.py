"""batch_commit_step: a trainer's step record, its batch's ack and its metrics, in one
statement on Postgres (issue 22: each round trip costs 1-5 ms on a loaded host), with the
effects of run_train_step_record + batch_ack + metric_record."""

from __future__ import annotations

import math

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from apps.buffer.models import Experience
from apps.buffer.services import batch_claim, batch_commit_step, batch_release, experience_write
from apps.runs.models import Metric, Run
from tests.factories import experience_row

pytestmark = pytest.mark.django_db


def _leased(run: Run, n: int = 4) -> list[int]:
    experience_write(experiences=[experience_row(run, key=f"k{i}") for i in range(n)])
    return [e.pk for e in batch_claim(run=run, worker="t", size=n)]


def _commit(run: Run, step: int, ids: list[int], metrics: dict[str, float]) -> str | None:
    """As the trainer does: a conflict rolls the transaction back."""
    outcome: str | None = None
    try:
        with transaction.atomic():
            outcome = batch_commit_step(run=run, step=step, worker="t", ids=ids, metrics=metrics)
            if outcome is not None:
                raise LookupError(outcome)
    except LookupError:
        pass
    return outcome


def test_it_records_the_step_acks_the_batch_and_stores_the_metrics_in_one_statement(run: Run) -> None:
    ids = _leased(run)
    with transaction.atomic(), CaptureQueriesContext(connection) as ctx:
        assert batch_commit_step(run=run, step=1, worker="t", ids=ids,
                                 metrics={"loss": 0.5, "claimed": 4.0, "nan": math.nan, "none": None}) is None  # type: ignore[dict-item]
    assert len([q for q in ctx.captured_queries if "SAVEPOINT" not in q["sql"]]) == 1
    run.refresh_from_db()
    assert run.train_step == 1
    assert set(Experience.objects.filter(pk__in=ids).values_list("status", "use_count", "lease_owner")) == {("consumed", 1, "")}
    assert dict(Metric.objects.filter(run=run, step=1).values_list("name", "value")) == {"loss": 0.5, "claimed": 4.0}


def test_a_step_another_trainer_recorded_acks_nothing_and_stores_no_metrics(run: Run) -> None:
    ids = _leased(run)
    Run.objects.filter(pk=run.pk).update(train_step=1)
    assert _commit(run, 1, ids, {"loss": 0.5}) == "recorded by another trainer"
    run.refresh_from_db()
    assert run.train_step == 1 and not Metric.objects.filter(run=run).exists()
    assert set(Experience.objects.filter(pk__in=ids).values_list("status", "use_count")) == {("leased", 0)}


def test_a_batch_whose_lease_was_lost_is_reported_and_rolled_back_with_the_step(run: Run) -> None:
    ids = _leased(run)
    batch_release(run=run, worker="t", ids=ids[:1])
    assert _commit(run, 1, ids, {"loss": 0.5}) == "lease lost"
    run.refresh_from_db()
    assert run.train_step == 0 and not Metric.objects.filter(run=run).exists()
    assert sorted(Experience.objects.filter(pk__in=ids).values_list("status", flat=True)) == ["leased"] * 3 + ["ready"]


def test_replay_sends_the_batch_back_to_ready_with_its_priority_decayed(run: Run) -> None:
    run.config = {**run.config, "replay": {"max_uses": 3, "priority_decay": 0.5}}
    run.save(update_fields=["config"])
    Experience.objects.filter(run=run).delete()
    ids = _leased(run)
    Experience.objects.filter(pk__in=ids).update(priority=2.0)
    assert _commit(run, 1, ids, {}) is None
    assert set(Experience.objects.filter(pk__in=ids).values_list("status", "use_count", "priority")) == {("ready", 1, 1.0)}

