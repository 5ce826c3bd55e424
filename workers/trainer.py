"""The trainer: Celery task `workers.trainer.train_step(run_id, step)` on queue `train`.

Each worker process keeps the policy (and the reference model when the algorithm needs
one) resident between steps. One step:

1. under a per-run Postgres advisory lock (one trainer per run at a time; released by the
   database if the process dies), check that `step` is the run's next one;
2. claim a batch with `batch_claim` (whole groups for GRPO, MIX and DPO; the staleness
   bound from `apps.runs.policy`), plus expert experiences for SFT and MIX;
3. one optimizer step with TRL's losses (`workers.algorithms`);
4. save the trainer state (weights, optimizer, scheduler) for this step, atomically;
5. in one transaction: `run.train_step` step-1 → step (conditional UPDATE: the idempotency
   guard) and `batch_ack`; on any failure before this, `batch_release`;
6. every `sync_interval` steps, publish version n through the weight sync.

A restart reloads the state saved for the step the database says is done, so nothing is
lost and nothing is trained twice: a crash between 4 and 5 leaves the batch leased (it
comes back to ready when the lease expires) and the newer state file unused.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import time
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from celery import shared_task
from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.db import InterfaceError, OperationalError, connection, transaction

log = logging.getLogger(__name__)

_LOCK_NAMESPACE = 7401  # first key of pg_try_advisory_lock(int, int): the trainer's locks
_KEEP_STATES = 2
_MAX_RESIDENT_RUNS = 2


def worker_name() -> str:
    return f"trainer@{socket.gethostname()}:{os.getpid()}"


def state_dir(run_id: int, step: int) -> Path:
    from workers.sync import run_storage

    return run_storage(run_id) / "trainer" / f"step-{step}"


# ----------------------------------------------------------------------------- resident models


@dataclass
class Resident:
    run_id: int
    config_key: str
    step: int
    model: Any
    tokenizer: Any
    ref_model: Any
    learner: Any


_RESIDENTS: OrderedDict[int, Resident] = OrderedDict()


def _device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _load_model(path: str) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(_device())


def resident_for(run: Any) -> Resident:
    """The run's policy as of `run.train_step`: the resident one if it is that, else loaded
    from the trainer state saved for that step (or the config's model at step 0)."""
    import torch
    from transformers import AutoTokenizer

    from workers.algorithms import Learner, spec_from_config

    key = json.dumps(run.config, sort_keys=True)
    res = _RESIDENTS.get(run.pk)
    if res is not None and res.config_key == key and res.step == run.train_step:
        _RESIDENTS.move_to_end(run.pk)
        return res
    _RESIDENTS.pop(run.pk, None)
    while len(_RESIDENTS) >= _MAX_RESIDENT_RUNS:
        _RESIDENTS.popitem(last=False)

    cfg = run.cfg
    torch.manual_seed(cfg.seed)
    optimizer_state = None
    source = cfg.model
    if run.train_step > 0:
        saved = state_dir(run.pk, run.train_step)
        if (saved / "config.json").exists():
            source = str(saved)
            optimizer_state = torch.load(saved / "optimizer.pt", map_location=_device(), weights_only=False)
        else:
            # Storage lost the state (not our own crash: the state is written before the step
            # commits). Carry on from the newest published version, with a fresh optimizer.
            from apps.runs.models import ModelVersion

            latest = ModelVersion.objects.filter(run=run).order_by("-number").values_list("checkpoint", flat=True).first()
            source = latest or cfg.model
            log.warning("run %s: no trainer state for step %s; resuming from %s", run.pk, run.train_step, source)
    tokenizer = AutoTokenizer.from_pretrained(cfg.tokenizer or cfg.model)
    model = _load_model(source)
    spec = spec_from_config(cfg)
    ref_model = _load_model(cfg.model) if spec.needs_ref else None
    learner = Learner(spec=spec, model=model, tokenizer=tokenizer, ref_model=ref_model)
    if optimizer_state is not None:
        learner.optimizer_state_load(optimizer_state)
    res = Resident(run.pk, key, run.train_step, model, tokenizer, ref_model, learner)
    _RESIDENTS[run.pk] = res
    return res


def resident_drop(run_id: int) -> None:
    _RESIDENTS.pop(run_id, None)


def state_save(*, res: Resident, step: int, batch_ids: list[int]) -> Path:
    import torch

    out = state_dir(res.run_id, step)
    tmp_parent = out.parent
    tmp_parent.mkdir(parents=True, exist_ok=True)
    # The optimizer goes into the same atomic directory as the weights.
    staging = tmp_parent / f".stage-{step}-{os.getpid()}"
    if staging.exists():
        shutil.rmtree(staging)
    res.model.save_pretrained(staging, safe_serialization=True)
    torch.save(res.learner.optimizer_state(), staging / "optimizer.pt")
    (staging / "trainer_state.json").write_text(json.dumps({"step": step, "batch": batch_ids}))
    if out.exists():
        shutil.rmtree(out)
    os.replace(staging, out)
    for old in sorted(tmp_parent.glob("step-*"), key=lambda p: int(p.name.split("-")[1]))[:-_KEEP_STATES]:
        if int(old.name.split("-")[1]) < step:
            shutil.rmtree(old, ignore_errors=True)
    return out


# ----------------------------------------------------------------------------- one step


@contextmanager
def run_lock(run_id: int) -> Iterator[bool]:
    """One trainer per run: a session-level advisory lock the database drops if we die."""
    if connection.vendor != "postgresql":
        yield True
        return
    with connection.cursor() as cur:
        cur.execute("SELECT pg_try_advisory_lock(%s, %s)", [_LOCK_NAMESPACE, run_id])
        got = bool(cur.fetchone()[0])
    try:
        yield got
    finally:
        if got:
            with connection.cursor() as cur:
                cur.execute("SELECT pg_advisory_unlock(%s, %s)", [_LOCK_NAMESPACE, run_id])


def _claim(*, run: Any, worker: str, min_version: int | None, tokenizer: Any = None) -> tuple[Any, list[Any]]:
    from apps.buffer.services import batch_claim
    from apps.runs.orchestration import batch_plan
    from apps.runs.selectors import preferences_among
    from workers.algorithms import TrainBatch, rollout_from_experience

    plan = batch_plan(cfg=run.cfg)
    usual = (
        batch_claim(run=run, worker=worker, size=plan.usual, group_complete=plan.whole_groups,
                    min_version=min_version, expert=False)
        if plan.usual else []
    )
    expert = batch_claim(run=run, worker=worker, size=plan.expert, expert=True) if plan.expert else []
    rows = usual + expert
    batch = TrainBatch(
        usual=[rollout_from_experience(e, tokenizer=tokenizer) for e in usual],
        expert=[rollout_from_experience(e, tokenizer=tokenizer) for e in expert],
    )
    if str(run.cfg.algorithm) == "dpo" and usual:
        batch.preferences = preferences_among(run=run, ids=[e.pk for e in usual])
    return batch, rows


def _publish_due(*, run: Any, res: Resident) -> float | None:
    from apps.runs import policy
    from workers.sync import weight_sync_for

    cfg = run.cfg
    if not policy.publishes_at(cfg=cfg, train_step=res.step):
        return None
    number = policy.version_for_train_step(cfg=cfg, train_step=res.step)
    if run.current_version >= number:
        return None
    return weight_sync_for().publish(run=run, number=number, train_step=res.step, model=res.model, tokenizer=res.tokenizer)


def _external_log(run_id: int, step: int, values: dict[str, float]) -> None:
    """W&B / TensorBoard when installed and configured (WANDB_PROJECT, RFT_TENSORBOARD_DIR)."""
    if os.environ.get("RFT_TENSORBOARD_DIR"):
        try:
            from torch.utils.tensorboard import SummaryWriter

            writer = SummaryWriter(log_dir=str(Path(os.environ["RFT_TENSORBOARD_DIR"]) / f"run-{run_id}"))
            for name, value in values.items():
                writer.add_scalar(f"train/{name}", value, step)
            writer.close()
        except ImportError:
            pass
    if os.environ.get("WANDB_PROJECT"):
        try:
            import wandb

            if wandb.run is None:
                wandb.init(project=os.environ["WANDB_PROJECT"], name=f"rftweb-run-{run_id}", reinit=True)
            wandb.log({f"train/{k}": v for k, v in values.items()}, step=step)
        except ImportError:
            pass


class StepConflict(RuntimeError):
    """Another trainer recorded this step first; ours is dropped."""


def trainer_step(*, run_id: int, step: int, worker: str | None = None) -> dict[str, Any]:
    """Train step `step` of run `run_id` if it is due; see the module docstring."""
    from apps.buffer.services import batch_ack, batch_release
    from apps.runs import policy
    from apps.runs.models import Run
    from apps.runs.orchestration import train_readiness
    from apps.runs.services import metric_record
    from workers.algorithms import NothingToTrain

    started = time.perf_counter()
    worker = worker or worker_name()
    with run_lock(run_id) as got:
        if not got:
            return {"status": "busy"}
        run = Run.objects.filter(pk=run_id).first()
        if run is None:
            return {"status": "gone"}
        if run.status != Run.Status.RUNNING:
            return {"status": "not running", "run_status": run.status}
        cfg = run.cfg
        if step == run.train_step and step > 0:
            # Re-dispatched after a crash between the step and its publish.
            seconds = _publish_due(run=run, res=resident_for(run))
            return {"status": "published" if seconds is not None else "done"}
        if step != run.train_step + 1 or step > cfg.total_steps:
            return {"status": "not due", "train_step": run.train_step}
        readiness = train_readiness(run=run)
        if not readiness.ready:
            return {"status": "waiting"}
        res = resident_for(run)
        trainer_version = run.current_version
        batch, rows = _claim(run=run, worker=worker, min_version=readiness.min_version, tokenizer=res.tokenizer)
        ids = [e.pk for e in rows]
        if not ids:
            return {"status": "waiting"}
        try:
            try:
                metrics = res.learner.step(batch)
            except NothingToTrain as exc:
                log.info("run %s step %s: %s; the batch is used up without an update", run_id, step, exc)
                metrics = {"skipped": 1.0}
            res.step = step
            state_save(res=res, step=step, batch_ids=ids)
            with transaction.atomic():
                if not Run.objects.filter(pk=run_id, train_step=step - 1).update(train_step=step):
                    raise StepConflict(f"run {run_id} step {step} was recorded by another trainer")
                batch_ack(run=run, worker=worker, ids=ids)
        except BaseException:
            # The in-memory weights may hold a step the database never got: reload next time.
            resident_drop(run_id)
            batch_release(run=run, worker=worker, ids=ids)
            raise
        run.train_step = step
        sync_seconds = _publish_due(run=run, res=res)
        metrics.update(
            {
                "staleness": float(policy.staleness(current_version=trainer_version, experience_versions=[e.model_version for e in rows])),
                "step_seconds": time.perf_counter() - started,
                "claimed": float(len(ids)),
            }
        )
        if sync_seconds is not None:
            metrics["sync_seconds"] = sync_seconds
        metric_record(run=run, step=step, values=metrics)
        _external_log(run_id, step, metrics)
    # Dispatch what this step unblocked now rather than at the conductor's next beat (the
    # dispatch markers keep it from doubling what the conductor sends).
    try:
        from apps.runs.orchestration import run_advance

        run_advance(run=run)
    except Exception:
        log.exception("run %s: could not dispatch after train step %s", run_id, step)
    return {"status": "trained", "step": step, "loss": metrics.get("loss"), "published": sync_seconds is not None}


def _fail_run(run_id: int, message: str) -> None:
    from apps.runs.models import Run

    Run.objects.filter(pk=run_id, status=Run.Status.RUNNING).update(status=Run.Status.FAILED, error=message[:4000])
    try:
        from apps.runs.events import event_publish

        event_publish(run_id=run_id, type="run.status", payload={"status": "failed", "action": "train", "error": message[:500]})
    except Exception:
        log.exception("could not announce the failure of run %s", run_id)


# Acked late (a worker that dies mid-step hands the message back); retried with backoff only
# for transient database errors; any other error fails the run with its message, since
# retrying a bad model path or a shape error would only repeat it. The soft limit releases
# the batch (the step is re-dispatched by the conductor).
@shared_task(
    name="workers.trainer.train_step",
    bind=True,
    acks_late=True,
    reject_on_worker_lost=True,
    time_limit=settings.RFT_TRAIN_TIME_LIMIT,
    soft_time_limit=max(1, settings.RFT_TRAIN_TIME_LIMIT - 60),
    autoretry_for=(OperationalError, InterfaceError),
    retry_backoff=2,
    retry_backoff_max=60,
    max_retries=5,
)
def train_step(self: Any, run_id: int, step: int) -> dict[str, Any]:
    try:
        return trainer_step(run_id=run_id, step=step)
    except (OperationalError, InterfaceError, StepConflict, SoftTimeLimitExceeded) as exc:
        if isinstance(exc, StepConflict):
            return {"status": "conflict"}
        if isinstance(exc, SoftTimeLimitExceeded):
            return {"status": "timed out"}
        raise
    except Exception as exc:
        log.exception("run %s train step %s failed", run_id, step)
        _fail_run(run_id, f"train step {step}: {type(exc).__name__}: {exc}")
        return {"status": "failed", "error": str(exc)}
