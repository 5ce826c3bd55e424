"""Run metrics: the one service the buffer's pipeline needs from runs, in a module of its own
so that apps.buffer imports nothing of apps.runs.services (which imports the buffer)."""

from __future__ import annotations

import math

from apps.runs.events import event_publish
from apps.runs.models import Metric, Run


def metric_record(*, run: Run, step: int, values: dict[str, float]) -> None:
    """Store one step's metrics and publish them to the run's group."""
    clean = {k: float(v) for k, v in values.items() if v is not None and math.isfinite(float(v))}
    Metric.objects.bulk_create([Metric(run=run, step=step, name=k, value=v) for k, v in clean.items()])
    event_publish(run_id=run.pk, type="run.metric", payload={"step": step, "values": clean})
