"""Run lifecycle services."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from django.db import transaction

from apps.runs.config import ConfigInvalid, RunConfig, config_dump, config_validate
from apps.runs.events import event_publish
from apps.runs.models import AuditEntry, Metric, ModelVersion, Run


class TransitionNotAllowed(ValueError):
    """The run is not in a status the action can start from."""


def run_create(*, name: str, owner: Any, config: dict[str, Any] | RunConfig, taskset: Any = None) -> Run:
    """Create a draft run; ConfigInvalid names each bad field."""
    cfg = config_validate(data=config)
    if not name.strip():
        raise ConfigInvalid({"name": "a run needs a name"})
    return Run.objects.create(name=name.strip(), owner=owner, config=config_dump(cfg), taskset=taskset)


def run_create_with_taskset(
    *,
    name: str,
    owner: Any,
    config: dict[str, Any] | RunConfig,
    taskset: Any = None,
    taskset_path: str | Path | None = None,
    taskset_name: str | None = None,
    progress: Callable[[int, int | None], None] | None = None,
) -> Run:
    """Create a draft run, importing its taskset file (JSONL, Parquet or a datasets
    directory) in the same transaction: a bad config (ConfigInvalid) is found before any
    import, and a bad taskset (ImportFailed) leaves neither a taskset nor a run behind."""
    from apps.buffer.importers import taskset_import
    from apps.runs.config import ConfigInvalid

    cfg = config_validate(data=config)
    if not name.strip():
        raise ConfigInvalid({"name": "a run needs a name"})
    with transaction.atomic():
        if taskset_path is not None:
            path = Path(taskset_path)
            taskset = taskset_import(name=taskset_name or path.stem, path=path, owner=owner, progress=progress)
        return run_create(name=name, owner=owner, config=cfg, taskset=taskset)


def run_feedback_policy_update(*, run: Run, feedback: dict[str, Any], actor: Any = None) -> Run:
    """Replace the run's feedback policy (validated with the whole config; ConfigInvalid
    names `feedback.<field>`), audited with the policy before and after."""
    with transaction.atomic():
        locked = Run.objects.select_for_update().get(pk=run.pk)
        before = dict(locked.config.get("feedback") or {})
        cfg = config_validate(data={**locked.config, "feedback": feedback})
        after = config_dump(cfg)["feedback"]
        locked.config = config_dump(cfg)
        locked.save(update_fields=["config", "updated_at"])
        AuditEntry.objects.create(
            run=locked,
            actor=actor if getattr(actor, "is_authenticated", False) else None,
            action="feedback_policy",
            detail={"before": before, "after": after},
        )
    run.refresh_from_db()
    transaction.on_commit(
        lambda: event_publish(
            run_id=run.pk, type="run.status", payload={"status": run.status, "action": "feedback_policy", "feedback": after}
        )
    )
    return run


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
    """Store one step's metrics, publish them to the run's group and, once committed, log
    them to the run's experiment trackers (apps.runs.trackers)."""
    import math

    clean = {k: float(v) for k, v in values.items() if v is not None and math.isfinite(float(v))}
    Metric.objects.bulk_create([Metric(run=run, step=step, name=k, value=v) for k, v in clean.items()])
    event_publish(run_id=run.pk, type="run.metric", payload={"step": step, "values": clean})
    from apps.runs.trackers import trackers_log_on_commit

    trackers_log_on_commit(run=run, step=step, values=clean)


def model_version_publish(
    *, run: Run, number: int, checkpoint: str, train_step: int = 0, seconds: float | None = None, size: int | None = None
) -> ModelVersion:
    """Record a new model version (idempotent on (run, number)), make it the run's current
    one if newer, and announce `weights.synced` once the transaction commits (with the
    seconds the publish took and the bytes it moved, when the weight sync says)."""
    from django.db.models import F, Value
    from django.db.models.functions import Greatest


    with transaction.atomic():
        version, _ = ModelVersion.objects.get_or_create(
            run=run, number=number, defaults={"checkpoint": checkpoint, "train_step": train_step}
        )
        Run.objects.filter(pk=run.pk).update(current_version=Greatest(F("current_version"), Value(number)))
    run.refresh_from_db(fields=["current_version"])
    payload: dict[str, Any] = {"version": number, "checkpoint": checkpoint, "train_step": train_step, "event": "published"}
    if seconds is not None:
        payload["seconds"] = seconds
    if size is not None:
        payload["bytes"] = size
    transaction.on_commit(lambda: event_publish(run_id=run.pk, type="weights.synced", payload=payload))
    cfg = run.cfg
    if cfg.eval_every and cfg.eval.taskset is not None and number % cfg.eval_every == 0:
        # On the rollout queue; the trainer goes on without waiting for it.
        run_id = run.pk
        transaction.on_commit(lambda: eval_dispatch(run_id=run_id, version=number))
    return version


def eval_dispatch(*, run_id: int, version: int) -> None:
    from rftweb.celery import app

    app.send_task("workers.evaluation.evaluate", args=[run_id, version])


def eval_result_record(*, run: Run, version: int, step: int, values: dict[str, float]) -> int:
    """Store an evaluation's `eval/…` metrics at the version's train step and announce the
    result; returns the run's best version so far (by `eval/reward_mean`, earliest on ties),
    which is also recorded as `eval/best_version`."""
    from apps.runs.selectors import eval_best

    with transaction.atomic():
        metric_record(run=run, step=step, values=values)
        best = eval_best(run=run)
        assert best is not None
        metric_record(run=run, step=step, values={"eval/best_version": float(best["version"])})
    payload = {"version": version, "step": step, "values": values, "best_version": best["version"],
               "best_reward_mean": best["reward_mean"]}
    transaction.on_commit(lambda: event_publish(run_id=run.pk, type="eval.result", payload=payload))
    return int(best["version"])


def weight_load_record(*, run: Run, version: int, worker: str, seconds: float) -> None:
    """An explorer loaded `version`: store it for the sync timeline and announce it."""
    from apps.runs.models import WeightLoad

    WeightLoad.objects.create(run=run, version=version, worker=worker, seconds=seconds)
    event_publish(
        run_id=run.pk,
        type="weights.synced",
        payload={"version": version, "worker": worker, "seconds": seconds, "event": "loaded"},
    )
