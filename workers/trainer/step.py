"""One train step (steps 1-7 of the package's docstring, workers/trainer/__init__.py): under the
run's trainer lock, check the step is due, claim its batch from the buffer's TrainSource,
journal it, step the resident learner, commit the step with its batch's ack and metrics,
publish the version it makes, snapshot when due; and go on with the next step while its
batch is there (`chain_seconds`)."""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Iterator
from concurrent.futures import wait as futures_wait
from contextlib import contextmanager
from typing import TYPE_CHECKING, NotRequired, TypedDict

from apps.buffer.ports import TrainSource
from apps.control.ports import (
    batch_plan,
    dispatch_begin,
    run_advance_after_step,
    train_readiness,
    train_step_continue,
    trainer_lock,
)
from apps.feedback.ports import batch_feedback_metrics, preferences_among
from apps.runs.ports import (
    ENDED,
    DispatchJob,
    RunView,
    metric_record,
    publishes_at,
    run_ended,
    run_view,
    staleness,
    version_for_train_step,
)
from kernel.algorithms import algorithm_get
from kernel.exceptions import Conflict
from workers.background import background_writer
from workers.trainer.journal import (
    rng_state,
    snapshot_and_prune,
    journal_encode,
    journal_store,
    snapshot_due,
)
from workers.trainer.resident import Resident, learner_step, resident_busy, resident_whole, resident_drop, resident_for
from workers.weights.handover import memory_sync_applies, MemorySync, sync_failure_note
from workers.weights.sync import CheckpointSync, SyncFailed, weight_sync_for

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from apps.buffer.ports import Experience
    from apps.control.ports import TrainReadiness
    from workers.algorithms.batch import TrainBatch

log = logging.getLogger(__name__)


class StepOutcome(TypedDict):
    """What a train task returns: its status and, by status, the step's figures."""

    status: str
    step: NotRequired[int]
    # The steps a chained call trained, in order.
    steps: NotRequired[list[int]]
    loss: NotRequired[float | None]
    published: NotRequired[bool]
    run_status: NotRequired[str]
    train_step: NotRequired[int]
    error: NotRequired[str]


def worker_name() -> str:
    return f"trainer@{socket.gethostname()}:{os.getpid()}"


@contextmanager
def run_lock(run_id: int) -> Iterator[bool]:
    """One trainer per run: a session-level advisory lock the database drops if we die (the
    loop reads it to tell a live trainer from a dead one)."""
    with trainer_lock(run_id) as got:
        yield got


def train_batch_claim(*, run: RunView, worker: str, min_version: int | None, tokenizer: PreTrainedTokenizerBase | None = None
           ) -> tuple[TrainBatch, list[Experience]]:
    from workers.algorithms import TrainBatch, rollout_from_experience

    plan = batch_plan(cfg=run.config)
    usual = (
        TrainSource.claim(run=run, worker=worker, size=plan.usual, group_complete=plan.whole_groups,
                          min_version=min_version, expert=False)
        if plan.usual else []
    )
    expert = TrainSource.claim(run=run, worker=worker, size=plan.expert, expert=True) if plan.expert else []
    rows = usual + expert
    batch = TrainBatch(
        usual=[rollout_from_experience(e, tokenizer=tokenizer) for e in usual],
        expert=[rollout_from_experience(e, tokenizer=tokenizer) for e in expert],
    )
    # An algorithm that trains on preference pairs (its declaration says so) gets the pairs people
    # stated among the batch's rollouts.
    if algorithm_get(run.config.algorithm).preference_pairs and usual:
        batch.preferences = preferences_among(run=run, ids=[e.pk for e in usual])
    return batch, rows


def publish_due(*, run: RunView, res: Resident) -> float | None:
    """Publish the version the step just trained when one is due (its seconds; None: none was).
    A sync that fails or runs past the run's sync_timeout_s raises SyncFailed, on the run's
    weight-sync timeline first; the task retries it (workers/trainer/task.py)."""
    try:
        return _publish_due(run=run, res=res)
    except SyncFailed as exc:
        sync_failure_note(exc)
        raise


def _publish_due(*, run: RunView, res: Resident) -> float | None:
    cfg = run.config
    if not publishes_at(cfg=cfg, train_step=res.step):
        return None
    number = version_for_train_step(cfg=cfg, train_step=res.step)
    if run.current_version >= number:
        return None
    # An explorer in this very process takes full weights from memory (workers/weights/handover.py);
    # an adapter (LoRA) is small and goes the usual way.
    if memory_sync_applies(cfg) and not getattr(cfg.trainer, "lora", None):
        return MemorySync().publish(run=run, number=number, train_step=res.step, model=resident_whole(res), tokenizer=res.tokenizer)
    sync = weight_sync_for()
    if res.gang is not None and res.gang.streams_versions and type(sync) is CheckpointSync:
        # From the shards to the files one tensor at a time: rank 0 never holds the whole model.
        published = sync.publish_written(run=run, number=number, train_step=res.step, tokenizer=res.tokenizer,
                                         write=res.gang.version_write)
    else:
        published = sync.publish(run=run, number=number, train_step=res.step, model=resident_whole(res),
                                 tokenizer=res.tokenizer)
    metric_record(run=run, step=res.step, values={"sync_bytes": float(published.bytes)})
    return published.seconds


class StepConflict(Conflict):
    """Another trainer recorded this step first; ours is dropped."""

    code = "step_conflict"


# Run statuses after which a run trains no more (a paused one may resume: the idle reaper's).
_ENDED = ENDED


def trainer_step(
    *, run_id: int, step: int, worker: str | None = None, chain_seconds: float = 0.0, task_id: str | None = None,
    node: str = "",
) -> StepOutcome:
    """Train step `step` of run `run_id` if it is due; see the module docstring.

    task_id: the Celery task's id, which the run's train dispatch must name (None: a call by
    hand, which runs if nothing else is out). chain_seconds > 0: then go on with the next
    steps in this same call while each is ready, starting none after chain_seconds. A step
    that can follow at once so skips the queue's round trip and the lock, run and readiness
    reads of a new task (in async mode, where the trainer sets the pace, that was a sixth of
    a step).
    """
    worker = worker or worker_name()
    hold = dispatch_begin(run_id=run_id, job=DispatchJob.TRAIN, step=step, task_id=task_id, worker=node or worker,
                          holder=worker)
    if hold is None:
        if run_ended(run_id):
            resident_drop(run_id)  # a task sent before the run stopped: its resident goes now
        return {"status": "superseded"}
    started = time.perf_counter()
    trained: list[int] = []
    run: RunView | None = None
    readiness: TrainReadiness | None = None
    result: StepOutcome = {"status": "busy"}
    try:
        with resident_busy(run_id), run_lock(run_id) as got:
            if not got:
                # Another task trains this run (by hand: dispatched ones hold the row); the
                # loop sends the step again at a later beat.
                return result
            chained = False
            while True:
                step_started = time.perf_counter()
                found, result = train_once(run_id=run_id, step=step, worker=worker, readiness=readiness,
                                            run=run if chained else None)
                run = found or run
                if result["status"] != "trained":
                    break
                assert run is not None  # a trained step comes with its run
                trained.append(step)
                elapsed = time.perf_counter() - started
                # Start no step that would likely end past the chain's time (tasks have limits).
                if elapsed + (time.perf_counter() - step_started) > chain_seconds:
                    break
                readiness = train_step_continue(run=run, step=step + 1)
                if readiness is None or not hold.move_to(step + 1):
                    break
                # Explorers may be waiting for the version this step published.
                run_advance_after_step(run=run, train=False)
                step += 1
                chained = True
    finally:
        hold.end()
    if (run is not None and run.train_step >= run.config.total_steps) or result.get("run_status") in _ENDED:
        # Nothing left to train: the policy's memory and a learner gang's processes go now,
        # not when another run evicts them (the last step's snapshot holds the state). A run
        # that ends otherwise (a used-up buffer, a stop) is the reaper's next pass.
        resident_drop(run_id)
    if run is not None and (trained or result["status"] == "published"):
        run_advance_after_step(run=run)
    if trained and result["status"] != "trained":
        result = {"status": "trained", "step": trained[-1]}  # a chained step that found no batch after all
    return {**result, "steps": trained} if trained else result


def _step_commit(*, run: RunView, res: Resident, step: int, worker: str, batch: TrainBatch, rows: list[Experience],
                 trainer_version: int, started: float) -> dict[str, float]:
    """The learner's step on the claimed batch, journaled, then recorded with its metrics (a
    StepConflict where the batch or the step is no longer this trainer's)."""
    from workers.algorithms import NothingToTrain

    run_id, ids = run.id, [e.pk for e in rows]
    # The journal entry is encoded here and written and fsynced while the learner
    # steps (file I/O leaves the GIL; encoding there would hold it against the
    # learner's Python), then waited for before the commit.
    data = journal_encode(step=step, batch=batch, batch_ids=ids, rng=rng_state())
    journal = background_writer("trainer-journal").submit(journal_store, run_id=run_id, step=step, data=data)
    try:
        metrics = learner_step(res.learner, batch, gang=res.gang, entry=data)
    except NothingToTrain as exc:
        log.info("run %s step %s: %s; the batch is used up without an update", run_id, step, exc)
        metrics = {"skipped": 1.0}
    except BaseException:
        futures_wait([journal])  # an entry for a step that never commits: its outcome is moot
        raise
    journal.result()  # durable before the commit
    res.step = step
    metrics.update(
        {
            "staleness": float(staleness(current_version=trainer_version, experience_versions=[e.model_version for e in rows])),
            "step_seconds": time.perf_counter() - started,
            "claimed": float(len(ids)),
            **batch_feedback_metrics(rows=rows),
        }
    )
    # The step record, the batch's ack and the step's metrics, together (one transaction,
    # one statement on Postgres; the view's train_step is then `step`). The metrics go
    # with the step, so that a worker killed right after the commit loses none (a
    # re-dispatch of a done step only publishes); their live event may go out just
    # before the COMMIT, the one statement left to fail.
    conflict = TrainSource.commit(run=run, step=step, worker=worker, ids=ids, metrics=metrics)
    if conflict == "recorded by another trainer":
        raise StepConflict(f"run {run_id} step {step} was recorded by another trainer")
    if conflict is not None:
        # Part of the batch is no longer ours (the loop took a step of a trainer it
        # thought dead back and released its leases): trained on, it could be
        # trained on twice. The step is not recorded; the loop sends it again.
        raise StepConflict(f"run {run_id} step {step}: the batch's lease was lost")
    return metrics


def train_once(
    *, run_id: int, step: int, worker: str, readiness: TrainReadiness | None = None, run: RunView | None = None
) -> tuple[RunView | None, StepOutcome]:
    """One step under the run's lock: (the run or None, the outcome). A chained step passes
    the run and readiness that train_step_continue has just read."""
    started = time.perf_counter()
    run = run or run_view(run_id)
    if run is None:
        return None, {"status": "gone"}
    if not run.running:
        return None, {"status": "not running", "run_status": run.status}
    cfg = run.config
    if step == run.train_step and step > 0:
        # Re-dispatched after a crash between the step and its publish.
        seconds = publish_due(run=run, res=resident_for(run))
        if seconds is not None:
            metric_record(run=run, step=step, values={"sync_seconds": seconds})
        return run, {"status": "published" if seconds is not None else "done"}
    if step != run.train_step + 1 or step > cfg.total_steps:
        return run, {"status": "not due", "train_step": run.train_step}
    # Leases this trainer still holds are an earlier try's that could not hand them back (the
    # database went away mid-step, so the release failed too): it holds the run's lock now, so
    # they are nobody else's. Back to the buffer at once, whether or not a batch is ready
    # without them: left out, they held the run's end until the lease ran out (300 s).
    if TrainSource.release(run=run, worker=worker) or readiness is None:
        readiness = train_readiness(run=run)
    if not readiness.ready:
        return run, {"status": "waiting"}
    res = resident_for(run)
    trainer_version = run.current_version
    batch, rows = train_batch_claim(run=run, worker=worker, min_version=readiness.min_version, tokenizer=res.tokenizer)
    ids = [e.pk for e in rows]
    if not ids:
        return run, {"status": "waiting"}
    try:
        metrics = _step_commit(run=run, res=res, step=step, worker=worker, batch=batch, rows=rows,
                               trainer_version=trainer_version, started=started)
    except BaseException:
        # The in-memory weights may hold a step the database never got: reload next time.
        resident_drop(run_id)
        TrainSource.release(run=run, worker=worker, ids=ids)
        raise
    sync_seconds = publish_due(run=run, res=res)
    if sync_seconds is not None:
        metrics["sync_seconds"] = sync_seconds
        metric_record(run=run, step=step, values={"sync_seconds": sync_seconds})
    # After the publish (explorers may be waiting for it); the journal already holds the step.
    if snapshot_due(step=step, total_steps=cfg.total_steps):
        snapshot_and_prune(res=res, step=step)
    return run, {"status": "trained", "step": step, "loss": metrics.get("loss"), "published": sync_seconds is not None}
