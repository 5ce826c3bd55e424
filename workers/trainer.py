"""The trainer: Celery task `workers.trainer.train_step(run_id, step)` on queue `train`.

Each worker process keeps the policy (and the reference model when the algorithm needs
one) resident between steps. One step:

1. under a per-run Postgres advisory lock (one trainer per run at a time; released by the
   database if the process dies), check that `step` is the run's next one;
2. claim a batch with `batch_claim` (whole groups for GRPO, MIX and DPO; the staleness
   bound from `apps.runs.policy`), plus expert experiences for SFT and MIX;
3. journal the step: the exact batch (tokens, logprobs, rewards, preferences) and the RNG
   state it starts from, written and fsynced;
4. one optimizer step with TRL's losses (`workers.algorithms`), none on a batch without learning
   signal (`train/skipped_no_signal`: the step is still recorded and its batch used up);
5. in one transaction: `run.train_step` step-1 → step (conditional UPDATE: the idempotency
   guard), `batch_ack` and the step's metrics; on any failure before this, `batch_release`;
6. every `sync_interval` steps, publish version n through the weight sync;
7. every `RFT_TRAINER_SNAPSHOT_STEPS` steps and at the last step, a full snapshot (weights,
   optimizer, scheduler), after which the journal entries and older snapshots it covers go.

A task runs only while its run's train dispatch names it (apps/control/orchestration.py) and
sets it idle when it ends. It goes on with the next step itself when that step's batch is
already there (async and offline runs, where the trainer sets the pace), for up to
`RFT_TRAIN_CHAIN_SECONDS`, moving its dispatch row on to that step so the loop does not
send it too.

A restart rebuilds the state as of the step the database says is done: the newest snapshot
at or before it, then the journaled steps after it replayed on their own batches from their
own RNG states (on CPU: the same weights and optimizer state, bit for bit). So nothing is
lost and nothing is trained twice: a crash between 3 and 5 leaves the batch leased (it
comes back to ready when the lease expires) and a journal entry for a step the database
never recorded, which a restart ignores and the step's next attempt overwrites. The journal
keeps the batch itself, not experience ids, because rewards and feedback in the buffer may
change after the step trained on them.

Why a journal and not a full state every step: weights plus Adam moments are 16 bytes per
parameter and saving them took 7% of a step on a 4M-parameter model (bench/trainer_overhead),
growing with the model; a journal entry grows with the batch only (about 1 ms).
"""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
import os
import shutil
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Collection, Iterator
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait as futures_wait
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from celery import shared_task, signals
from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.db import InterfaceError, OperationalError, connection, transaction

from rftweb.exceptions import Conflict

log = logging.getLogger(__name__)

_MAX_RESIDENT_RUNS = 2


def worker_name() -> str:
    return f"trainer@{socket.gethostname()}:{os.getpid()}"


def trainer_dir(run_id: int) -> Path:
    from workers.sync import run_storage

    return run_storage(run_id) / "trainer"


def state_dir(run_id: int, step: int) -> Path:
    """The full snapshot after step `step` (a save_pretrained directory plus optimizer.pt),
    present only for snapshot steps (`snapshot_due`) until a newer snapshot replaces it."""
    return trainer_dir(run_id) / f"step-{step}"


def journal_path(run_id: int, step: int) -> Path:
    return trainer_dir(run_id) / "journal" / f"step-{step}.json"


def snapshot_due(*, step: int, total_steps: int) -> bool:
    every = max(1, int(settings.RFT_TRAINER_SNAPSHOT_STEPS))
    return step % every == 0 or step >= total_steps


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
    # A learner group's rank 0 side (workers.algorithms.distributed) when trainer.processes > 1.
    group: Any = None
    # time.monotonic() of the last task that used it (the idle reaper's clock).
    used: float = field(default_factory=time.monotonic)


_RESIDENTS: OrderedDict[int, Resident] = OrderedDict()
# Guards _RESIDENTS, _BUSY and _reaper between train tasks (threads, in the embedded
# default) and the idle reaper; held briefly, never across a step.
_RESIDENTS_LOCK = threading.Lock()
# Runs with a train task in progress in this process (count): the reaper leaves them be.
_BUSY: dict[int, int] = {}
_reaper: threading.Thread | None = None


def _device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _load_model(path: str, dtype: Any = None) -> Any:
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    from workers.vision import is_vision_model

    auto = AutoModelForImageTextToText if is_vision_model(path) else AutoModelForCausalLM
    return auto.from_pretrained(path, dtype=dtype or torch.float32).to(_device())


def _policy_load(*, cfg: Any, spec: Any, source: str) -> tuple[Any, Any]:
    """(policy, reference model or None) for a run config, its weights from `source` (the
    config's model, a snapshot or a published version). With `trainer.lora` the policy is
    the config's model (frozen; held in the training precision) plus an adapter, fresh or
    loaded from `source`, and there is no reference model: the base is the reference."""
    from workers.adapters import adapter_load, adapter_wrap, is_adapter_dir
    from workers.precision import precision_dtype

    if spec.lora is None:
        if is_adapter_dir(source):
            raise ValueError(f"{source} holds an adapter but the run's trainer.lora is not set")
        model = _load_model(source)
        return model, (_load_model(cfg.model) if spec.needs_ref_model else None)
    base = _load_model(cfg.model, dtype=precision_dtype(spec.precision))
    if is_adapter_dir(source):
        return adapter_load(base_model=base, path=source, trainable=True), None
    if source != cfg.model:
        raise ValueError(f"{source} holds full weights but the run trains a LoRA adapter on {cfg.model}")
    return adapter_wrap(model=base, lora=spec.lora), None


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
        res.used = time.monotonic()
        return res
    resident_drop(run.pk)
    # Least recently used first, but never one a train task is using (another thread of the
    # embedded pool, mid-step: its learner group would be closed under it); with every
    # resident busy, the cap is exceeded until one of them is done.
    with _RESIDENTS_LOCK:
        idle = [run_id for run_id in _RESIDENTS if run_id not in _BUSY]
    for run_id in idle[: max(0, len(_RESIDENTS) - _MAX_RESIDENT_RUNS + 1)]:
        resident_drop(run_id)

    cfg = run.cfg
    torch.manual_seed(cfg.seed)
    optimizer_state = None
    source = cfg.model
    replay: list[Path] = []
    fallback = False
    if run.train_step > 0:
        point = _restore_point(run.pk, run.train_step)
        if point is not None:
            snapshot, replay = point
            if snapshot is not None:
                source = str(snapshot)
                optimizer_state = torch.load(snapshot / "optimizer.pt", map_location=_device(), weights_only=False)
        else:
            # Storage lost the trainer state (not our own crash: every step is journaled
            # before it commits). Carry on from the newest published version, with a fresh
            # optimizer.
            from apps.runs.models import ModelVersion

            latest = ModelVersion.objects.filter(run=run).order_by("-number").values_list("checkpoint", flat=True).first()
            source = latest or cfg.model
            fallback = True
            log.warning("run %s: no trainer state for step %s; resuming from %s", run.pk, run.train_step, source)
    spec = spec_from_config(cfg)
    # Before loading gigabytes: a precision the device lacks fails the run with its reason.
    from workers.precision import optimizer_check, precision_check

    precision_check(spec.precision, device=_device())
    optimizer_check(spec.optimizer, device=_device())
    tokenizer = AutoTokenizer.from_pretrained(cfg.tokenizer or cfg.model)
    model, ref_model = _policy_load(cfg=cfg, spec=spec, source=source)
    from workers.vision import is_vision_model, processor_load

    processor = processor_load(str(cfg.model)) if is_vision_model(str(cfg.model)) else None
    if _device() == "cpu" and settings.RFT_TRAINER_CPU_MMAP_THRESHOLD > 0:
        from workers.host_memory import cpu_allocator_tune

        cpu_allocator_tune(threshold=settings.RFT_TRAINER_CPU_MMAP_THRESHOLD)
    learner = Learner(spec=spec, model=model, tokenizer=tokenizer, ref_model=ref_model, processor=processor)
    if optimizer_state is not None:
        learner.optimizer_state_load(optimizer_state)
    group = _group_start(run=run, learner=learner)
    if replay:
        _replay(learner, replay, group=group)
        log.info("run %s: replayed %s journaled step(s) up to step %s", run.pk, len(replay), run.train_step)
    res = Resident(run.pk, key, run.train_step, model, tokenizer, ref_model, learner, group)
    if run.train_step > 0 and not fallback:
        # A crash may have left the newest version's background checkpoint unwritten.
        from workers.handover import handover_repair

        handover_repair(run=run, model=model, tokenizer=tokenizer, train_step=run.train_step)
    if fallback:
        # The journal from here on needs a base that a later restart can find.
        snapshot_save(res=res, step=run.train_step)
    with _RESIDENTS_LOCK:
        _RESIDENTS[run.pk] = res
    _reaper_ensure()
    return res


def _group_start(*, run: Any, learner: Any) -> Any:
    """With trainer.processes > 1, the follower processes of the run's learner group, given
    this learner's state (None: one process)."""
    processes = int(run.cfg.trainer.processes)
    if processes <= 1:
        return None
    from workers.algorithms.distributed import LearnerGroup

    return LearnerGroup(learner=learner, run_config=run.config, world=processes,
                        timeout_s=float(settings.RFT_TRAIN_TIME_LIMIT))


def _learner_step(learner: Any, batch: Any, *, group: Any, entry: bytes) -> dict[str, Any]:
    if group is None:
        result: dict[str, Any] = learner.step(batch)
        return result
    return dict(group.step(batch, entry=entry))


def resident_drop(run_id: int) -> None:
    """Forget the run's resident policy; a learner group's followers are told to end."""
    with _RESIDENTS_LOCK:
        res = _RESIDENTS.pop(run_id, None)
    if res is not None and res.group is not None:
        res.group.close()


@contextmanager
def _resident_busy(run_id: int) -> Iterator[None]:
    """A train task of `run_id` is in progress: the idle reaper leaves its resident alone,
    and its idle clock restarts when the task ends."""
    with _RESIDENTS_LOCK:
        _BUSY[run_id] = _BUSY.get(run_id, 0) + 1
    try:
        yield
    finally:
        with _RESIDENTS_LOCK:
            _BUSY[run_id] -= 1
            if not _BUSY[run_id]:
                del _BUSY[run_id]
            res = _RESIDENTS.get(run_id)
            if res is not None:
                res.used = time.monotonic()


def residents_reap(*, idle_seconds: float, ended: Collection[int] = ()) -> list[int]:
    """Drop every resident none is using now that no task has used for `idle_seconds` (a
    paused run, or one whose train tasks stopped coming) or whose run is in `ended` (a run
    that finished on a used-up buffer or was stopped gets no further train task to drop it);
    returns their runs."""
    now = time.monotonic()
    with _RESIDENTS_LOCK:
        idle = [run_id for run_id, res in _RESIDENTS.items()
                if run_id not in _BUSY and (run_id in ended or now - res.used >= idle_seconds)]
        dropped = [_RESIDENTS.pop(run_id) for run_id in idle]
    for res in dropped:
        log.info("run %s: %s; its resident policy (and learner group) ends", res.run_id,
                 "the run has ended" if res.run_id in ended else f"trainer idle for {now - res.used:.0f} s")
        if res.group is not None:
            res.group.close()
    return idle


def _ended_residents() -> set[int]:
    """Runs with a resident here that have ended (one query)."""
    from apps.runs.models import Run

    with _RESIDENTS_LOCK:
        ids = list(_RESIDENTS)
    if not ids:
        return set()
    return set(Run.objects.filter(pk__in=ids, status__in=_ENDED).values_list("pk", flat=True))


def _reaper_ensure() -> None:
    """A daemon thread in this worker process that reaps idle residents
    (RFT_TRAINER_IDLE_SECONDS; 0: never) and ends when none is left."""
    global _reaper
    with _RESIDENTS_LOCK:
        if float(settings.RFT_TRAINER_IDLE_SECONDS) <= 0 or (_reaper is not None and _reaper.is_alive()):
            return
        _reaper = threading.Thread(target=_reap_loop, name="trainer-idle-reaper", daemon=True)
        _reaper.start()


def _reap_loop() -> None:
    global _reaper
    while True:
        idle = float(settings.RFT_TRAINER_IDLE_SECONDS)
        time.sleep(min(30.0, max(0.2, idle / 4)) if idle > 0 else 30.0)
        try:
            if idle > 0:
                residents_reap(idle_seconds=idle, ended=_ended_residents())
        except Exception:
            log.exception("trainer idle reaper: dropping a resident failed")
        finally:
            from django.db import connection

            connection.close()  # this thread's own: not held open between passes
        with _RESIDENTS_LOCK:
            if not _RESIDENTS or idle <= 0:
                _reaper = None
                return


# ----------------------------------------------------------------------------- trainer state


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _rng_state() -> dict[str, Any]:
    import torch

    def enc(t: Any) -> str:
        return base64.b64encode(t.numpy().tobytes()).decode("ascii")

    state: dict[str, Any] = {"cpu": enc(torch.get_rng_state())}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = [enc(t.cpu()) for t in torch.cuda.get_rng_state_all()]
    return state


def _rng_restore(state: dict[str, Any]) -> None:
    import torch

    def dec(text: str) -> Any:
        return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8)

    torch.set_rng_state(dec(state["cpu"]))
    if state.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([dec(t) for t in state["cuda"]])


def journal_encode(*, step: int, batch: Any, batch_ids: list[int], rng: dict[str, Any]) -> bytes:
    """What step `step` trains on: the batch as trained (not ids: the buffer's rewards and
    feedback may change later) and the RNG state the step starts from. Shallow field reads
    and one C-level json.dumps (dataclasses.asdict deep-copies: ms more per step)."""

    def rollout(r: Any) -> dict[str, Any]:
        return {f.name: getattr(r, f.name) for f in dataclasses.fields(r)}

    entry = {
        "step": step,
        "batch_ids": batch_ids,
        "usual": [rollout(r) for r in batch.usual],
        "expert": [rollout(r) for r in batch.expert],
        "preferences": [list(p) for p in batch.preferences],
        "rng": rng,
    }
    return json.dumps(entry).encode()


def journal_store(*, run_id: int, step: int, data: bytes) -> Path:
    """Write an encoded entry durably (fsynced file, atomic rename, fsynced directory); it
    replaces the entry of an earlier attempt at this step, which never committed."""
    out = journal_path(run_id, step)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.{os.getpid()}"
    with tmp.open("wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, out)
    _fsync_path(out.parent)
    return out


_JOURNAL_WRITER: ThreadPoolExecutor | None = None


def _journal_writer() -> ThreadPoolExecutor:
    # Made on first use, in the worker process (not before a prefork pool forks).
    global _JOURNAL_WRITER
    if _JOURNAL_WRITER is None:
        _JOURNAL_WRITER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="trainer-journal")
    return _JOURNAL_WRITER


def journal_read(path: Path) -> tuple[Any, dict[str, Any]]:
    """A journal entry's batch and the RNG state its step started from."""
    return journal_decode(path.read_bytes())


def journal_decode(data: bytes) -> tuple[Any, dict[str, Any]]:
    """What journal_encode wrote: (the batch, the RNG state)."""
    from workers.algorithms import Rollout, TrainBatch

    entry = json.loads(data)
    batch = TrainBatch(
        usual=[Rollout(**r) for r in entry["usual"]],
        expert=[Rollout(**r) for r in entry["expert"]],
        preferences=[(int(w), int(l)) for w, l in entry["preferences"]],
    )
    return batch, entry["rng"]


def snapshot_save(*, res: Resident, step: int) -> Path:
    """The full trainer state after `step`, atomically and durably (the journal it lets go
    of is deleted right after)."""
    import torch

    out = state_dir(res.run_id, step)
    parent = out.parent
    parent.mkdir(parents=True, exist_ok=True)
    # The optimizer goes into the same atomic directory as the weights.
    staging = parent / f".stage-{step}-{os.getpid()}"
    if staging.exists():
        shutil.rmtree(staging)
    res.model.save_pretrained(staging, safe_serialization=True)
    torch.save(res.learner.optimizer_state(), staging / "optimizer.pt")
    (staging / "trainer_state.json").write_text(json.dumps({"step": step}))
    for path in staging.iterdir():
        _fsync_path(path)
    if out.exists():
        shutil.rmtree(out)
    os.replace(staging, out)
    _fsync_path(parent)
    return out


def _step_of(path: Path) -> int | None:
    try:
        return int(path.name.removesuffix(".json").split("-")[1])
    except (IndexError, ValueError):
        return None


def _snapshots(run_id: int) -> dict[int, Path]:
    out = {}
    for path in trainer_dir(run_id).glob("step-*"):
        step = _step_of(path)
        if step is not None and (path / "optimizer.pt").exists():
            out[step] = path
    return out


def state_prune(*, run_id: int, snapshot_step: int) -> None:
    """Drop what the snapshot of `snapshot_step` covers: older snapshots and the journal up
    to it. Only called once that step has committed, so a restart never needs them."""
    for step, path in _snapshots(run_id).items():
        if step < snapshot_step:
            shutil.rmtree(path, ignore_errors=True)
    for path in (trainer_dir(run_id) / "journal").glob("step-*.json"):
        entry_step = _step_of(path)
        if entry_step is not None and entry_step <= snapshot_step:
            path.unlink(missing_ok=True)


def _restore_point(run_id: int, train_step: int) -> tuple[Path | None, list[Path]] | None:
    """The newest snapshot at or before `train_step` (None: the config's model at step 0)
    whose later steps are all in the journal, with those journal entries in order."""
    snapshots = _snapshots(run_id)
    for base in sorted([s for s in snapshots if s <= train_step] + [0], reverse=True):
        entries = [journal_path(run_id, s) for s in range(base + 1, train_step + 1)]
        if all(e.exists() for e in entries):
            return snapshots.get(base) if base > 0 else None, entries
    return None


def _replay(learner: Any, entries: list[Path], *, group: Any = None) -> None:
    from workers.algorithms import NothingToTrain

    for path in entries:
        data = path.read_bytes()
        batch, rng = journal_decode(data)
        _rng_restore(rng)
        try:
            _learner_step(learner, batch, group=group, entry=data)
        except NothingToTrain:
            pass  # the original step made no update either


def _snapshot_and_prune(*, res: Resident, step: int) -> None:
    """After the step committed; a failure here loses nothing (the journal still holds the
    step), so it is logged, not raised."""
    try:
        snapshot_save(res=res, step=step)
        state_prune(run_id=res.run_id, snapshot_step=step)
    except Exception:
        log.exception("run %s: could not write the trainer snapshot of step %s; the journal covers it", res.run_id, step)


# ----------------------------------------------------------------------------- one step


@contextmanager
def run_lock(run_id: int) -> Iterator[bool]:
    """One trainer per run: a session-level advisory lock the database drops if we die (the
    loop reads it to tell a live trainer from a dead one)."""
    from apps.control.orchestration import TRAINER_LOCK_NAMESPACE

    if connection.vendor != "postgresql":
        yield True
        return
    with connection.cursor() as cur:
        cur.execute("SELECT pg_try_advisory_lock(%s, %s)", [TRAINER_LOCK_NAMESPACE, run_id])
        got = bool(cur.fetchone()[0])
    try:
        yield got
    finally:
        if got:
            with connection.cursor() as cur:
                cur.execute("SELECT pg_advisory_unlock(%s, %s)", [TRAINER_LOCK_NAMESPACE, run_id])


def _claim(*, run: Any, worker: str, min_version: int | None, tokenizer: Any = None) -> tuple[Any, list[Any]]:
    from apps.buffer.services import batch_claim
    from apps.control.orchestration import batch_plan
    from apps.feedback.selectors import preferences_among
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
    from workers.handover import MemorySync, memory_sync_applies
    from workers.sync import weight_sync_for

    cfg = run.cfg
    if not policy.publishes_at(cfg=cfg, train_step=res.step):
        return None
    number = policy.version_for_train_step(cfg=cfg, train_step=res.step)
    if run.current_version >= number:
        return None
    # An explorer in this very process takes full weights from memory (workers/handover.py);
    # an adapter (LoRA) is small and goes the usual way.
    if memory_sync_applies(cfg) and not getattr(cfg.trainer, "lora", None):
        return MemorySync().publish(run=run, number=number, train_step=res.step, model=res.model, tokenizer=res.tokenizer)
    published = weight_sync_for().publish(run=run, number=number, train_step=res.step, model=res.model, tokenizer=res.tokenizer)
    from apps.runs.services import metric_record

    metric_record(run=run, step=res.step, values={"sync_bytes": float(published.bytes)})
    return published.seconds


class StepConflict(Conflict):
    """Another trainer recorded this step first; ours is dropped."""


# Run statuses after which a run trains no more (a paused one may resume: the idle reaper's).
_ENDED = ("finished", "stopped", "failed")


def _run_ended(run_id: int) -> bool:
    from apps.runs.models import Run

    return Run.objects.filter(pk=run_id, status__in=_ENDED).exists()


def trainer_step(
    *, run_id: int, step: int, worker: str | None = None, chain_seconds: float = 0.0, task_id: str | None = None,
    node: str = "",
) -> dict[str, Any]:
    """Train step `step` of run `run_id` if it is due; see the module docstring.

    task_id: the Celery task's id, which the run's train dispatch must name (None: a call by
    hand, which runs if nothing else is out). chain_seconds > 0: then go on with the next
    steps in this same call while each is ready, starting none after chain_seconds. A step
    that can follow at once so skips the queue's round trip and the lock, run and readiness
    reads of a new task (in async mode, where the trainer sets the pace, that was a sixth of
    a step).
    """
    from apps.runs.models import Dispatch
    from apps.control.orchestration import dispatch_begin, run_advance_after_step, train_step_continue

    worker = worker or worker_name()
    hold = dispatch_begin(run_id=run_id, kind=Dispatch.Kind.TRAIN, step=step, task_id=task_id, worker=node or worker,
                          holder=worker)
    if hold is None:
        if _run_ended(run_id):
            resident_drop(run_id)  # a task sent before the run stopped: its resident goes now
        return {"status": "superseded"}
    started = time.perf_counter()
    trained: list[int] = []
    run: Any = None
    readiness: Any = None
    result: dict[str, Any] = {"status": "busy"}
    try:
        with _resident_busy(run_id), run_lock(run_id) as got:
            if not got:
                # Another task trains this run (by hand: dispatched ones hold the row); the
                # loop sends the step again at a later beat.
                return result
            chained = False
            while True:
                step_started = time.perf_counter()
                found, result = _train_once(run_id=run_id, step=step, worker=worker, readiness=readiness,
                                            run=run if chained else None)
                run = found or run
                if result["status"] != "trained":
                    break
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
    if (run is not None and run.train_step >= run.cfg.total_steps) or result.get("run_status") in _ENDED:
        # Nothing left to train: the policy's memory and a learner group's processes go now,
        # not when another run evicts them (the last step's snapshot holds the state). A run
        # that ends otherwise (a used-up buffer, a stop) is the reaper's next pass.
        resident_drop(run_id)
    if run is not None and (trained or result["status"] == "published"):
        run_advance_after_step(run=run)
    if trained and result["status"] != "trained":
        result = {"status": "trained", "step": trained[-1]}  # a chained step that found no batch after all
    return {**result, "steps": trained} if trained else result


def _train_once(
    *, run_id: int, step: int, worker: str, readiness: Any = None, run: Any = None
) -> tuple[Any, dict[str, Any]]:
    """One step under the run's lock: (the run or None, the outcome). A chained step passes
    the run and readiness that train_step_continue has just read."""
    from apps.buffer.services import batch_commit_step, batch_release
    from apps.feedback.selectors import batch_feedback_metrics
    from apps.runs import policy
    from apps.runs.models import Run
    from apps.control.orchestration import train_readiness
    from apps.runs.services import metric_record
    from workers.algorithms import NothingToTrain

    started = time.perf_counter()
    run = run or Run.objects.filter(pk=run_id).first()
    if run is None:
        return None, {"status": "gone"}
    if run.status != Run.Status.RUNNING:
        return None, {"status": "not running", "run_status": run.status}
    cfg = run.cfg
    if step == run.train_step and step > 0:
        # Re-dispatched after a crash between the step and its publish.
        seconds = _publish_due(run=run, res=resident_for(run))
        if seconds is not None:
            metric_record(run=run, step=step, values={"sync_seconds": seconds})
        return run, {"status": "published" if seconds is not None else "done"}
    if step != run.train_step + 1 or step > cfg.total_steps:
        return run, {"status": "not due", "train_step": run.train_step}
    readiness = readiness or train_readiness(run=run)
    if not readiness.ready and batch_release(run=run, worker=worker):
        # Leases this trainer still held were an earlier try's that could not hand them back
        # (the database went away mid-step, so the release failed too): it holds the run's lock
        # now, so they are nobody else's. Back to the buffer at once, not when the lease runs out.
        readiness = train_readiness(run=run)
    if not readiness.ready:
        return run, {"status": "waiting"}
    res = resident_for(run)
    trainer_version = run.current_version
    batch, rows = _claim(run=run, worker=worker, min_version=readiness.min_version, tokenizer=res.tokenizer)
    ids = [e.pk for e in rows]
    if not ids:
        return run, {"status": "waiting"}
    try:
        # The journal entry is encoded here and written and fsynced while the learner
        # steps (file I/O leaves the GIL; encoding there would hold it against the
        # learner's Python), then waited for before the commit.
        data = journal_encode(step=step, batch=batch, batch_ids=ids, rng=_rng_state())
        journal = _journal_writer().submit(journal_store, run_id=run_id, step=step, data=data)
        try:
            metrics = _learner_step(res.learner, batch, group=res.group, entry=data)
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
                "staleness": float(policy.staleness(current_version=trainer_version, experience_versions=[e.model_version for e in rows])),
                "step_seconds": time.perf_counter() - started,
                "claimed": float(len(ids)),
                **batch_feedback_metrics(rows=rows),
            }
        )
        with transaction.atomic():
            # The step record, the batch's ack and the step's metrics, together (one
            # statement on Postgres). The metrics go with the step, so that a worker killed
            # right after the commit loses none (a re-dispatch of a done step only
            # publishes); their live event may go out just before the COMMIT, the one
            # statement left to fail.
            conflict = batch_commit_step(run=run, step=step, worker=worker, ids=ids, metrics=metrics)
            if conflict == "recorded by another trainer":
                raise StepConflict(f"run {run_id} step {step} was recorded by another trainer")
            if conflict is not None:
                # Part of the batch is no longer ours (the loop took a step of a trainer it
                # thought dead back and released its leases): trained on, it could be
                # trained on twice. The step is not recorded; the loop sends it again.
                raise StepConflict(f"run {run_id} step {step}: the batch's lease was lost")
    except BaseException:
        # The in-memory weights may hold a step the database never got: reload next time.
        resident_drop(run_id)
        batch_release(run=run, worker=worker, ids=ids)
        raise
    run.train_step = step
    sync_seconds = _publish_due(run=run, res=res)
    if sync_seconds is not None:
        metrics["sync_seconds"] = sync_seconds
        metric_record(run=run, step=step, values={"sync_seconds": sync_seconds})
    # After the publish (explorers may be waiting for it); the journal already holds the step.
    if snapshot_due(step=step, total_steps=cfg.total_steps):
        _snapshot_and_prune(res=res, step=step)
    return run, {"status": "trained", "step": step, "loss": metrics.get("loss"), "published": sync_seconds is not None}


def _fail_run(run_id: int, step: int, exc: BaseException) -> None:
    """Record the failure for the run page and fail the run through run_transition."""
    from apps.runs.failures import task_failure_record

    try:
        task_failure_record(run_id=run_id, task="workers.trainer.train_step", step=step, worker=worker_name(),
                            exception=exc, fail_now=True)
    except Exception:
        log.exception("could not record the failure of run %s", run_id)


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
        return trainer_step(run_id=run_id, step=step, chain_seconds=settings.RFT_TRAIN_CHAIN_SECONDS,
                            task_id=self.request.id, node=self.request.hostname or "")
    except (OperationalError, InterfaceError, StepConflict, SoftTimeLimitExceeded) as exc:
        if isinstance(exc, StepConflict):
            return {"status": "conflict"}
        if isinstance(exc, SoftTimeLimitExceeded):
            return {"status": "timed out"}
        raise
    except Exception as exc:
        log.exception("run %s train step %s failed", run_id, step)
        _fail_run(run_id, step, exc)
        return {"status": "failed", "error": str(exc)}


@signals.worker_ready.connect
def _import_the_learner_at_start(sender: Any = None, **_: Any) -> None:
    """A worker that serves the train queue imports torch, transformers and TRL as it starts
    (tens of seconds on a busy CPU host) rather than inside its first step, where the time
    would count against the step and delay the run's first version."""
    queues = {q.name for q in getattr(getattr(sender, "task_consumer", None), "queues", [])}
    if "train" in queues:
        import workers.algorithms  # noqa: F401
