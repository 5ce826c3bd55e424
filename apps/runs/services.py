"""Run lifecycle services."""

from __future__ import annotations

from typing import Any

from django.db import transaction

from apps.runs.config import RunConfig, config_dump, config_validate
from apps.runs.events import event_publish
from apps.runs.models import AuditEntry, Metric, ModelVersion, Run


class TransitionNotAllowed(ValueError):
    """The run is not in a status the action can start from."""


def run_create(*, name: str, owner: Any, config: dict[str, Any] | RunConfig, taskset: Any = None) -> Run:
    """Create a draft run; ConfigInvalid names each bad field."""
    cfg = config_validate(data=config)
    if not name.strip():
        from apps.runs.config import ConfigInvalid

        raise ConfigInvalid({"name": "a run needs a name"})
    return Run.objects.create(name=name.strip(), owner=owner, config=config_dump(cfg), taskset=taskset)


_TRANSITIONS: dict[str, tuple[set[str], str]] = {
    "start": ({Run.Status.DRAFT, Run.Status.STOPPED, Run.Status.FAILED}, Run.Status.RUNNING),
    "pause": ({Run.Status.RUNNING}, Run.Status.PAUSED),
    "resume": ({Run.Status.PAUSED}, Run.Status.RUNNING),
    "stop": ({Run.Status.RUNNING, Run.Status.PAUSED, Run.Status.DRAFT}, Run.Status.STOPPED),
}


def run_transition(*, run: Run, action: str, actor: Any = None) -> Run:
    """Move a run through its lifecycle with a conditional UPDATE, so two clicks or two
    processes cannot both win; audited and announced on the run's group."""
    if action not in _TRANSITIONS:
        raise TransitionNotAllowed(f"unknown action {action!r}")
    sources, target = _TRANSITIONS[action]
    with transaction.atomic():
        changed = Run.objects.filter(pk=run.pk, status__in=sources).update(status=target)
        if not changed:
            run.refresh_from_db(fields=["status"])
            raise TransitionNotAllowed(f"cannot {action} a run that is {run.status}")
        AuditEntry.objects.create(run=run, actor=actor if getattr(actor, "is_authenticated", False) else None, action=action)
    run.refresh_from_db()
    transaction.on_commit(
        lambda: event_publish(run_id=run.pk, type="run.status", payload={"status": run.status, "action": action})
    )
    if target == Run.Status.RUNNING:
        # The conductor enqueues explore and train steps; pause and stop end it by status.
        from apps.runs.orchestration import conduct_kick

        run_id = run.pk
        transaction.on_commit(lambda: conduct_kick(run_id=run_id))
    return run


def metric_record(*, run: Run, step: int, values: dict[str, float]) -> None:
    """Store one step's metrics and publish them to the run's group."""
    import math

    clean = {k: float(v) for k, v in values.items() if v is not None and math.isfinite(float(v))}
    Metric.objects.bulk_create([Metric(run=run, step=step, name=k, value=v) for k, v in clean.items()])
    event_publish(run_id=run.pk, type="run.metric", payload={"step": step, "values": clean})


def model_version_publish(*, run: Run, number: int, checkpoint: str, train_step: int = 0) -> ModelVersion:
    """Record a new model version (idempotent on (run, number)), make it the run's current
    one if newer, and announce `weights.synced` once the transaction commits."""
    from django.db.models import F, Value
    from django.db.models.functions import Greatest


    with transaction.atomic():
        version, _ = ModelVersion.objects.get_or_create(
            run=run, number=number, defaults={"checkpoint": checkpoint, "train_step": train_step}
        )
        Run.objects.filter(pk=run.pk).update(current_version=Greatest(F("current_version"), Value(number)))
    run.refresh_from_db(fields=["current_version"])
    payload = {"version": number, "checkpoint": checkpoint, "train_step": train_step, "event": "published"}
    transaction.on_commit(lambda: event_publish(run_id=run.pk, type="weights.synced", payload=payload))
    return version


def weight_load_record(*, run: Run, version: int, worker: str, seconds: float) -> None:
    """An explorer loaded `version`: store it for the sync timeline and announce it."""
    from apps.runs.models import WeightLoad

    WeightLoad.objects.create(run=run, version=version, worker=worker, seconds=seconds)
    event_publish(
        run_id=run.pk,
        type="weights.synced",
        payload={"version": version, "worker": worker, "seconds": seconds, "event": "loaded"},
    )
