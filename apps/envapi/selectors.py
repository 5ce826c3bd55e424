"""Reads for the environment API and the key pages."""

from __future__ import annotations

from datetime import datetime
from typing import TypedDict

from django.contrib.auth.models import User
from django.db.models import QuerySet

from apps.envapi.models import ApiKey
from apps.runs.models import ModelVersion, Run


class CurrentVersion(TypedDict):
    """The API's ModelVersionOut (apps/envapi/schemas.py)."""

    number: int
    checkpoint: str
    train_step: int
    created_at: datetime | None


def run_current_version(*, run: Run) -> CurrentVersion:
    """The run's current model version; version 0 is the config's starting model."""
    version = ModelVersion.objects.filter(run=run, number=run.current_version).first()
    if version is not None:
        return {"number": version.number, "checkpoint": version.checkpoint, "train_step": version.train_step,
                "created_at": version.created_at}
    return {"number": run.current_version, "checkpoint": run.cfg.model, "train_step": 0, "created_at": None}


def api_keys_of_run(*, run: Run) -> QuerySet[ApiKey]:
    return ApiKey.objects.filter(runs=run).select_related("created_by").order_by("revoked_at", "-created_at")


def api_keys_created_by(*, user: User) -> QuerySet[ApiKey]:
    """The keys `user` made (on their runs' key pages), active first, each with its runs."""
    return ApiKey.objects.filter(created_by=user).prefetch_related("runs").order_by("revoked_at", "-created_at")


class TasksetImportOut(TypedDict):
    """The API's TasksetOut (apps/envapi/schemas.py)."""

    id: int
    name: str
    import_status: str
    rows_imported: int
    rows_total: int | None
    error: str
    tasks: int


def run_taskset_import(*, run: Run) -> TasksetImportOut | None:
    """The run's taskset and where its import stands (None: the run has none)."""
    taskset = run.taskset
    if taskset is None:
        return None
    ready = taskset.import_status == "ready"
    return {
        "id": taskset.pk, "name": taskset.name, "import_status": taskset.import_status,
        "rows_imported": taskset.import_rows if not ready or taskset.import_rows else taskset.tasks.count(),
        "rows_total": taskset.import_total if not ready or taskset.import_total else taskset.tasks.count(),
        "error": taskset.import_error, "tasks": taskset.tasks.count() if ready else 0,
    }
