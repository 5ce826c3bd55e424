"""Reads for the environment API and the key pages."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet

from apps.envapi.models import ApiKey
from apps.runs.models import ModelVersion, Run


def run_current_version(*, run: Run) -> dict[str, Any]:
    """The run's current model version; version 0 is the config's starting model."""
    version = ModelVersion.objects.filter(run=run, number=run.current_version).first()
    if version is not None:
        return {"number": version.number, "checkpoint": version.checkpoint, "train_step": version.train_step,
                "created_at": version.created_at}
    return {"number": run.current_version, "checkpoint": run.cfg.model, "train_step": 0, "created_at": None}


def api_keys_of_run(*, run: Run) -> QuerySet[ApiKey]:
    return ApiKey.objects.filter(runs=run).select_related("created_by").order_by("revoked_at", "-created_at")
