from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from django.contrib.auth.models import User

from apps.buffer.models import Experience
from apps.runs.models import Metric, Run
from tests.factories import make_run, make_taskset


@pytest.fixture(autouse=True)
def _metrics_unbuffered(settings) -> None:
    # Tests read the metrics right after each write.
    settings.RFT_PIPELINE_METRICS_SECONDS = 0.0


@pytest.fixture
def make_pipeline_run(owner: User):
    """A run whose config lists the given pipeline steps per stage."""

    def make(*, on_write: Sequence[Any] = (), on_claim: Sequence[Any] = (), on_import: Sequence[Any] = (), **config: Any) -> Run:
        pipeline = {"on_write": list(on_write), "on_claim": list(on_claim), "on_import": list(on_import)}
        return make_run(owner=owner, taskset=make_taskset(owner=owner), name="piped", pipeline=pipeline, **config)

    return make


def reasons(run: Run) -> dict[str, str]:
    """key -> filter_reason of every filtered experience of the run."""
    return dict(Experience.objects.filter(run=run, status="filtered").values_list("key", "filter_reason"))


def metrics(run: Run) -> dict[str, float]:
    """Pipeline metric totals of the run, by name."""
    totals: dict[str, float] = {}
    for name, value in Metric.objects.filter(run=run, name__startswith="pipeline/").values_list("name", "value"):
        totals[name] = totals.get(name, 0.0) + value
    return totals
