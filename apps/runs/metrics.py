"""Run metrics: the one service the buffer's pipeline needs from runs, in a module of its own
so that apps.buffer imports nothing of apps.runs.services (which imports the buffer)."""

from __future__ import annotations

import math

from apps.runs.events import event_publish
from apps.runs.models import Metric, Run
from apps.runs.trackers import trackers_log_on_commit


def metric_record(*, run: Run, step: int, values: dict[str, float]) -> None:
    """Store one step's metrics, publish them to the run's stream and, once committed, log
    them to the run's experiment trackers (apps.runs.trackers)."""
    clean = metric_values_clean(values)
    Metric.objects.bulk_create([Metric(run=run, step=step, name=k, value=v) for k, v in clean.items()])
    metric_announce(run=run, step=step, values=clean)


def metric_values_clean(values: dict[str, float]) -> dict[str, float]:
    """The values metric_record stores: finite numbers (None, NaN and inf are left out)."""
    return {k: float(v) for k, v in values.items() if v is not None and math.isfinite(float(v))}


def metric_announce(*, run: Run, step: int, values: dict[str, float]) -> None:
    """What metric_record does once the values are stored (also for batch_commit_step,
    which stores a step's metrics in its own statement): publish them now and log them to
    the run's trackers once the transaction commits."""
    event_publish(run_id=run.pk, type="run.metric", payload={"step": step, "values": values})

    trackers_log_on_commit(run=run, step=step, values=values)
