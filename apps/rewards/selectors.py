from __future__ import annotations

from collections.abc import Sequence

from apps.buffer.models import Experience
from apps.runs.models import ModelVersion, Run


def experiences_awaiting_rewards(*, run: Run, ids: Sequence[int]) -> list[Experience]:
    """Those of `ids` in `run` whose metadata still lists remote rewards to wait for."""
    rows = Experience.objects.filter(run=run, pk__in=list(ids)).select_related("task").order_by("pk")
    return [e for e in rows if (e.metadata or {}).get("awaiting_rewards")]


def run_current_model(*, run: Run) -> str:
    """The checkpoint of the run's current version; version 0 is the config's model."""
    version = ModelVersion.objects.filter(run=run, number=run.current_version).first()
    return version.checkpoint if version is not None else run.cfg.model
