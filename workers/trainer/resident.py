"""The resident learner: each trainer process keeps a run's policy (and the reference model
when the algorithm needs one, and a learner gang's followers when trainer.processes > 1)
in memory between steps, at most `_MAX_RESIDENT_RUNS` runs (RFT_TRAINER_RESIDENT_RUNS), least
recently used first out.
A resident is rebuilt as of the step the database says is done (workers/trainer/journal.py:
the newest snapshot, then the journaled steps replayed); an idle reaper drops the residents
of runs that stopped training (RFT_TRAINER_IDLE_SECONDS) or ended."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from django.conf import settings

from apps.runs.ports import RunView, connection_release, runs_ended, version_latest
from workers.trainer.journal import restore_point, rng_restore, journal_decode, snapshot_save
from workers.engines.base import tokenizer_from_pretrained
from workers.models.policy import policy_load, train_device
from workers.weights.handover import handover_repair
from workers.host_memory import cpu_allocator_tune, rank_mmap_threshold
from workers.precision import optimizer_check, precision_check
from workers.vision import is_vision_model, processor_load

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase

    from apps.runs.ports import RunConfig
    from workers.algorithms.batch import TrainBatch
    from workers.algorithms.gang import LearnerGang
    from workers.algorithms.learner import Learner
    from workers.algorithms.trainee import LearnerSpec
    from workers.algorithms.sharding import LearnerBuild

log = logging.getLogger(__name__)

# A deployment's setting (each resident holds a policy, its optimizer and its reference model).
_MAX_RESIDENT_RUNS = max(1, settings.RFT_TRAINER_RESIDENT_RUNS)


@dataclass
class Resident:
    run_id: int
    config_key: str
    step: int
    model: torch.nn.Module
    tokenizer: PreTrainedTokenizerBase
    ref_model: torch.nn.Module | None
    learner: Learner
    # A learner gang's rank 0 side (workers.algorithms.gang) when trainer.processes > 1.
    gang: LearnerGang | None = None
    # time.monotonic() of the last task that used it (the idle reaper's clock).
    used: float = field(default_factory=time.monotonic)


RESIDENTS: OrderedDict[int, Resident] = OrderedDict()
# Guards RESIDENTS, _BUSY and _reaper between train tasks (threads, in the embedded
# default) and the idle reaper; held briefly, never across a step.
RESIDENTS_LOCK = threading.Lock()
# Runs with a train task in progress in this process (count): the reaper leaves them be.
_BUSY: dict[int, int] = {}
_reaper: threading.Thread | None = None


def resident_for(run: RunView) -> Resident:
    """The run's policy as of `run.train_step`: the resident one if it is that, else loaded
    from the trainer state saved for that step (or the config's model at step 0)."""
    import torch

    from workers.algorithms import Learner, spec_from_config

    key = json.dumps(run.config_data, sort_keys=True)
    res = _resident_kept(run, key)
    if res is not None:
        return res
    cfg = run.config
    torch.manual_seed(cfg.seed)
    start = _start_point(run)
    source, optimizer_state, sharded, replay, fallback = (start.source, start.optimizer_state, start.sharded,
                                                          start.replay, start.fallback)
    spec = spec_from_config(cfg)
    # Before loading gigabytes: a precision the device lacks fails the run with its reason.
    precision_check(spec.precision, device=train_device())
    optimizer_check(spec.optimizer, device=train_device())
    tokenizer = tokenizer_from_pretrained(cfg.tokenizer or cfg.model)
    # Rank 0 of a learner gang that starts from the run's model builds on its shards only,
    # once the gang is joined (workers/algorithms/sharding.py); else the learner is whole.
    build = _rank0_build(run=run, spec=spec, tokenizer=tokenizer, source=source)
    learner: Learner | None = None
    if build is None:
        model, ref_model = policy_load(cfg=cfg, spec=spec, source=source)

    processor = processor_load(str(cfg.model)) if is_vision_model(str(cfg.model)) else None
    if train_device() == "cpu" and settings.RFT_TRAINER_CPU_MMAP_THRESHOLD > 0:
        # Rank 0 of a learner gang holds its share of the batch and of each gradient: its
        # threshold is scaled to that share (workers/host_memory.py says why).
        cpu_allocator_tune(threshold=rank_mmap_threshold(settings.RFT_TRAINER_CPU_MMAP_THRESHOLD,
                                                         world=max(1, int(cfg.trainer.processes))))
    if build is None:
        learner = Learner(spec=spec, model=model, tokenizer=tokenizer, ref_model=ref_model, processor=processor)
        if optimizer_state is not None:
            learner.optimizer_state_load(optimizer_state)
    gang = gang_start(run=run, learner=learner, checkpoint=sharded, build=build)
    if gang is not None:
        learner, model, ref_model = gang.learner, gang.learner.model, gang.learner.ref_model
    assert learner is not None
    if gang is None and sharded is not None:
        from workers.algorithms.sharding import sharded_load

        sharded_load(learner, sharded)
    if replay:
        _replay(learner, replay, gang=gang)
        log.info("run %s: replayed %s journaled step(s) up to step %s", run.id, len(replay), run.train_step)
    # With a learner gang the resident's model is the gang's unsharded copy (what versions
    # are written from), brought up to date from the shards where one is written (`resident_whole`).
    res = Resident(run.id, key, run.train_step, gang.whole if gang is not None and gang.whole is not None else model,
                   tokenizer, ref_model, learner, gang)
    if run.train_step > 0 and not fallback:
        # A crash may have left the newest version's background checkpoint unwritten.
        handover_repair(run=run, model=resident_whole(res), tokenizer=tokenizer, train_step=run.train_step)
    if fallback:
        # The journal from here on needs a base that a later restart can find.
        snapshot_save(res=res, step=run.train_step)
    with RESIDENTS_LOCK:
        RESIDENTS[run.id] = res
    _reaper_ensure()
    return res


def _resident_kept(run: RunView, key: str) -> Resident | None:
    """The resident policy where it is the run's as of `run.train_step` (None: dropped, and
    room made for the one about to be loaded)."""
    res = RESIDENTS.get(run.id)
    # A learner gang that lost a rank after its step was committed (while publishing or
    # writing a snapshot) is not kept: its ranks may be anywhere in a collective.
    broken = res is not None and res.gang is not None and res.gang.broken
    if res is not None and res.config_key == key and res.step == run.train_step and not broken:
        RESIDENTS.move_to_end(run.id)
        res.used = time.monotonic()
        return res
    resident_drop(run.id)
    # Least recently used first, but never one a train task is using (another thread of the
    # embedded pool, mid-step: its learner gang would be closed under it); with every
    # resident busy, the cap is exceeded until one of them is done.
    with RESIDENTS_LOCK:
        idle = [run_id for run_id in RESIDENTS if run_id not in _BUSY]
    for run_id in idle[: max(0, len(RESIDENTS) - _MAX_RESIDENT_RUNS + 1)]:
        resident_drop(run_id)
    return None


@dataclass
class _StartPoint:
    """Where a resident policy starts from: whole weights (`source`, with the optimizer's
    state where saved) or a learner gang's sharded snapshot (`sharded`, loaded after the
    learner is built from the config's model), then the journaled steps to replay."""

    source: str
    optimizer_state: dict[str, object] | None = None
    sharded: Path | None = None
    replay: list[Path] = field(default_factory=list)
    fallback: bool = False  # the trainer state was lost: from the newest published version


def _start_point(run: RunView) -> _StartPoint:
    import torch

    cfg = run.config
    start = _StartPoint(source=cfg.model)
    if run.train_step <= 0:
        return start
    point = restore_point(run.id, run.train_step)
    if point is None:
        # Storage lost the trainer state (not our own crash: every step is journaled
        # before it commits). Carry on from the newest published version, with a fresh
        # optimizer.
        latest = version_latest(run_id=run.id)
        start.source = latest.checkpoint if latest is not None else cfg.model
        start.fallback = True
        log.warning("run %s: no trainer state for step %s; resuming from %s", run.id, run.train_step, start.source)
        return start
    snapshot, start.replay = point
    if snapshot is not None and (snapshot / "dcp" / ".metadata").exists():
        start.sharded = snapshot / "dcp"
    elif snapshot is not None:
        start.source = str(snapshot)
        start.optimizer_state = torch.load(snapshot / "optimizer.pt", map_location=train_device(), weights_only=False)
    return start


def _rank0_build(*, run: RunView, spec: LearnerSpec, tokenizer: PreTrainedTokenizerBase, source: str
                 ) -> LearnerBuild | None:
    """What rank 0 of the run's learner gang builds its learner from on its shards only
    (None: one process, or a learner loaded whole first: see workers/algorithms/sharding.py)."""
    t = run.config.trainer
    if int(t.processes) <= 1:
        return None
    from workers.algorithms.sharding import LearnerBuild, rank0_sharded_fits

    model = str(run.config.model)
    if not rank0_sharded_fits(sharding=str(t.sharding), model=model, source=str(source), lora=spec.lora is not None):
        return None
    return LearnerBuild(cfg=run.config, spec=spec, tokenizer=tokenizer, source=None if str(source) == model else str(source))


def gang_start(*, run: RunView, learner: Learner | None, checkpoint: Path | None = None,
               build: LearnerBuild | None = None) -> LearnerGang | None:
    """With trainer.processes > 1, the run's learner gang (this process rank 0, followers
    started on this host), given this learner's state or, `checkpoint`, a sharded snapshot's;
    `learner` None: rank 0's is built on its shards from `build` (None: one process)."""
    t = run.config.trainer
    if int(t.processes) <= 1:
        return None
    from workers.algorithms.gang import GangPlan, LearnerGang
    from workers.algorithms.learner import spec_from_config

    # One learner gang per process (it is the default process group): another run's idle
    # one goes first.
    with RESIDENTS_LOCK:
        others = [rid for rid, r in RESIDENTS.items() if r.gang is not None and rid != run.id and rid not in _BUSY]
    for rid in others:
        resident_drop(rid)
    # The policy's skeleton versions are written from, its weights on the meta device until
    # a version gathers them from the shards (sharded `none`, rank 0's replica is whole already).
    whole = None
    if t.sharding != "none":
        from workers.algorithms.sharding import model_skeleton

        whole = model_skeleton(cfg=run.config, spec=spec_from_config(run.config))
    return LearnerGang(learner=learner, run_config=run.config_data,
                       plan=GangPlan(world=int(t.processes), hosts=int(t.hosts), sharding=str(t.sharding)),
                       timeout_s=float(t.collective_timeout_s), whole=whole,
                       addr=settings.RFT_LEARNER_ADDR, port=settings.RFT_LEARNER_PORT, checkpoint=checkpoint,
                       build=build)


def resident_whole(res: Resident) -> torch.nn.Module:
    """The resident's whole policy: its model, or its learner gang's shards gathered."""
    return res.gang.whole_model() if res.gang is not None else res.model


def learner_step(learner: Learner, batch: TrainBatch, *, gang: LearnerGang | None, entry: bytes) -> dict[str, float]:
    if gang is None:
        return learner.step(batch)
    return dict(gang.step(batch, entry=entry))


def _replay(learner: Learner, entries: list[Path], *, gang: LearnerGang | None = None) -> None:
    from workers.algorithms import NothingToTrain

    for path in entries:
        data = path.read_bytes()
        batch, rng = journal_decode(data)
        rng_restore(rng)
        try:
            learner_step(learner, batch, gang=gang, entry=data)
        except NothingToTrain:
            pass  # the original step made no update either


def resident_drop(run_id: int) -> None:
    """Forget the run's resident policy; a learner gang's followers are told to end."""
    with RESIDENTS_LOCK:
        res = RESIDENTS.pop(run_id, None)
    if res is not None and res.gang is not None:
        res.gang.close()


@contextmanager
def resident_busy(run_id: int) -> Iterator[None]:
    """A train task of `run_id` is in progress: the idle reaper leaves its resident alone,
    and its idle clock restarts when the task ends."""
    with RESIDENTS_LOCK:
        _BUSY[run_id] = _BUSY.get(run_id, 0) + 1
    try:
        yield
    finally:
        with RESIDENTS_LOCK:
            _BUSY[run_id] -= 1
            if not _BUSY[run_id]:
                del _BUSY[run_id]
            res = RESIDENTS.get(run_id)
            if res is not None:
                res.used = time.monotonic()


def residents_reap(*, idle_seconds: float, ended: Collection[int] = ()) -> list[int]:
    """Drop every resident none is using now that no task has used for `idle_seconds` (a
    paused run, or one whose train tasks stopped coming) or whose run is in `ended` (a run
    that finished on a used-up buffer or was stopped gets no further train task to drop it);
    returns their runs."""
    now = time.monotonic()
    with RESIDENTS_LOCK:
        idle = [run_id for run_id, res in RESIDENTS.items()
                if run_id not in _BUSY and (run_id in ended or now - res.used >= idle_seconds)]
        dropped = [RESIDENTS.pop(run_id) for run_id in idle]
    for res in dropped:
        log.info("run %s: %s; its resident policy (and learner gang) ends", res.run_id,
                 "the run has ended" if res.run_id in ended else f"trainer idle for {now - res.used:.0f} s")
        if res.gang is not None:
            res.gang.close()
    return idle


def residents_ended() -> set[int]:
    """Runs with a resident here that have ended (one query)."""
    with RESIDENTS_LOCK:
        ids = list(RESIDENTS)
    return runs_ended(ids)


def _reaper_ensure() -> None:
    """A daemon thread in this worker process that reaps idle residents
    (RFT_TRAINER_IDLE_SECONDS; 0: never) and ends when none is left."""
    global _reaper
    with RESIDENTS_LOCK:
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
                residents_reap(idle_seconds=idle, ended=residents_ended())
        except Exception:
            log.exception("trainer idle reaper: dropping a resident failed")
        finally:
            connection_release()  # this thread's own: not held open between passes
        with RESIDENTS_LOCK:
            if not RESIDENTS or idle <= 0:
                _reaper = None
                return
