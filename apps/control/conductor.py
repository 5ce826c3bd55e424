"""The conductor, the RFT core's one loop: it decides, from Postgres alone, which explore and
train steps of the running runs may go now, and sends them to their queues.

Its whole state is the `Dispatch` row of each run and job (explore, train): idle, sent (with
the Celery task id of the message), running (on which worker, under which lease owner),
claimed through the project's one mechanism (apps/runs/dispatch.py); the other jobs' rows
there (reward-model training and export) are not the loop's and it leaves them alone.

- `conductor_beat` is one pass of the loop: a beat every RFT_CONDUCT_SECONDS
  (apps/control/conductor_beat.py) runs `run_advance` for every running run. An explorer or
  trainer that has just ended a step runs it for its own run at once (`run_advance_after_step`): in async mode that hop is
  what lets the two sides overlap. Both send a step only through `dispatch_send`, a
  conditional UPDATE idle → sent, so however many of them look, a step is sent once.
- A worker runs a task only if `dispatch_begin` lets it (the message the row names, or any
  when the row is idle), moves the row on when it chains to the next step itself
  (`DispatchHold.move_to`) and sets it idle when the task ends (`DispatchHold.end`).
- `dispatch_recover` takes back what was lost: a message no worker picked up within
  RFT_DISPATCH_RESEND_SECONDS is sent again under the same id (the first copy to arrive
  runs, later ones find the row taken). Each further copy waits twice as long as the one
  before, up to RFT_DISPATCH_RESEND_MAX_SECONDS (15, 30, 60 ... 300 s; the row counts its
  `copies`): a message the broker lost is sent again within the first wait as before (one
  lost after it had already waited long, within the wait it was at: 5 minutes at most), and
  one merely waiting behind other runs' steps on a busy queue gets a handful of copies
  rather than one every 15 s (24 runs on one train worker piled 150-190 in the queue). The
  backoff rather than asking the broker whether the message still waits: it needs no
  knowledge of the transport (Celery's Redis lists today), and a copy costs a worker only
  a claim that finds the row taken. A running step whose worker died (its heartbeat
  stopped or it restarted; for the trainer, no session holds the run's trainer lock) has
  its leases handed back and is sent again, within seconds rather than a lease's or the
  broker's visibility timeout. Nothing runs twice for it: the explorer's writes are keyed
  by task attempt and a trainer step commits only while its batch is still leased to it.

The web side may import this module: no torch, no TRL (tasks are sent by name).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F, Q
from django.utils import timezone

from apps.buffer.models import Experience, TaskAttempt
from apps.buffer.selectors import experiences_claimable, experiences_in_whole_groups
from apps.buffer.services import batch_release, lease_reap, task_release
from apps.runs import schedule
from kernel.algorithms import BatchPlan, algorithm_get
from kernel.config import RunConfig
from apps.runs.dispatch import DispatchHold, dispatch_claim
from apps.runs.models import Dispatch, ModelVersion, Run, WorkerHeartbeat
from apps.runs.services import TransitionNotAllowed, eval_dispatch, run_transition
from rftweb.celery import app

log = logging.getLogger(__name__)

EXPLORE_TASK = "workers.explore.explorer.explore_step"
TRAIN_TASK = "workers.trainer.task.train_step"
# A version's weights zipped for download (apps/control/weights.py): on a train worker, which
# has torch and peft (a LoRA version is merged into its base).
EXPORT_TASK = "workers.weights.download.weights_export_zip"
_TASKS = {Dispatch.Job.EXPLORE: (EXPLORE_TASK, "rollout"), Dispatch.Job.TRAIN: (TRAIN_TASK, "train"),
          Dispatch.Job.EXPORT: (EXPORT_TASK, "train")}
# First key of the trainer's pg_try_advisory_lock(int, int) on a run (workers/trainer/).
TRAINER_LOCK_NAMESPACE = 7401


# ----------------------------------------------------------------------------- readiness


def experiences_claimable_count(
    *, run: Run, min_version: int | None, expert: bool | None, whole_groups: bool, limit: int
) -> int:
    """How many experiences `batch_claim` with these arguments could hand out now, counted
    up to `limit` (readiness only asks whether a batch is there, not how much more)."""
    qs = experiences_claimable(run=run, now=timezone.now(), min_version=min_version, expert=expert)
    if whole_groups:
        qs = experiences_in_whole_groups(run=run, qs=qs)
    return qs[:limit].count()


def batch_plan(*, cfg: RunConfig) -> BatchPlan:
    """What a train step of this run claims: its algorithm's declaration says."""
    return algorithm_get(cfg.algorithm).batch_plan(cfg)


def explore_finished(*, run: Run) -> bool:
    """No more experiences will come from the explorer for this run."""
    cfg = run.cfg
    if not schedule.explores(cfg):
        # No explorer of its own, but an environment (the REST API, an agent through the
        # OpenAI-compatible endpoint) that claimed the run's tasks sends more while any of
        # them is queued or leased. A run nobody claims tasks of trains on what the buffer holds.
        return not TaskAttempt.objects.filter(
            run=run, status__in=[TaskAttempt.Status.QUEUED, TaskAttempt.Status.LEASED]
        ).exists()
    if run.explore_step < cfg.total_steps:
        return False
    return not TaskAttempt.objects.filter(run=run, status=TaskAttempt.Status.LEASED).exists()


@dataclass(frozen=True)
class TrainReadiness:
    ready: bool
    final: bool  # no full batch will ever come: train on what there is, then stop
    usual: int
    expert: int
    min_version: int | None


def train_readiness(*, run: Run) -> TrainReadiness:
    """Whether train step run.train_step + 1 has its batch in the buffer."""
    cfg = run.cfg
    plan = batch_plan(cfg=cfg)
    min_version = schedule.min_version_for_claim(cfg=cfg, current_version=run.current_version)
    usual = (
        experiences_claimable_count(
            run=run, min_version=min_version, expert=False, whole_groups=plan.whole_groups, limit=plan.usual
        )
        if plan.usual else 0
    )
    expert = (
        experiences_claimable_count(run=run, min_version=None, expert=True, whole_groups=False, limit=plan.expert)
        if plan.expert else 0
    )
    pending = Experience.objects.filter(run=run, status=Experience.Status.PENDING).exists()
    final = explore_finished(run=run) and not pending
    full, some = algorithm_get(cfg.algorithm).batch_ready(plan, usual=usual, expert=expert)
    return TrainReadiness(ready=full or (final and some), final=final, usual=usual, expert=expert, min_version=min_version)


# ----------------------------------------------------------------------------- dispatch


def _send(name: str, args: list[object], queue: str, task_id: str) -> None:
    app.send_task(name, args=args, queue=queue, task_id=task_id)


def dispatch_send(*, run: Run, job: str, step: int) -> bool:
    """Claim the run's `job` for `step` (idle → sent: of two conductors looking at once, one
    wins) and queue its task. False: a step of that job is out already."""
    hold = dispatch_claim(run_id=run.pk, job=job, state=Dispatch.State.SENT, step=step)
    if hold is None:
        return False
    name, queue = _TASKS[Dispatch.Job(job)]
    try:
        _send(name, [run.pk, step], queue, hold.task_id)
    except Exception:
        # The broker is away: idle again, so the loop's next beat sends it once it is back.
        Dispatch.objects.filter(run=run, job=job, task_id=hold.task_id, state=Dispatch.State.SENT).update(
            state=Dispatch.State.IDLE
        )
        raise
    return True


def dispatch_begin(*, run_id: int, job: str, step: int, task_id: str | None, worker: str, holder: str) -> DispatchHold | None:
    """A task is about to run `step`: it may if the run's row names its message, or if
    nothing is out (an idle row, or none: a task sent by hand). None: another message owns
    the row, or this message already ran (a copy re-sent for a message thought lost), so
    it is a duplicate or out of date and does nothing. task_id None: a call by hand (tests,
    benches), which takes the row over whatever it holds."""
    mine = (Q(state=Dispatch.State.SENT, task_id=task_id) | (Q(state=Dispatch.State.IDLE) & ~Q(task_id=task_id))
            if task_id is not None else Q())
    return dispatch_claim(run_id=run_id, job=job, state=Dispatch.State.RUNNING, when=mine, step=step,
                          task_id=task_id, worker=worker, holder=holder)


@dataclass(frozen=True)
class Lost:
    reason: str
    # The worker is gone for certain: its leases can go back to the buffer at once.
    release: bool


def _trainer_lock_held(run_id: int) -> bool:
    """Whether some database session holds the run's trainer lock (a live trainer does for
    the whole of its task; the database drops it with a dead one's connection)."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted AND classid = %s"
            " AND objid = %s AND objsubid = 2 AND database = (SELECT oid FROM pg_database WHERE datname = current_database()))",
            [TRAINER_LOCK_NAMESPACE, run_id],
        )
        return bool(cur.fetchone()[0])


def resend_wait(*, copies: int) -> timedelta:
    """How long the latest of `copies` copies of a message may wait in its queue before the
    next is sent: RFT_DISPATCH_RESEND_SECONDS for the first, doubled for each further one,
    at most RFT_DISPATCH_RESEND_MAX_SECONDS."""
    first = settings.RFT_DISPATCH_RESEND_SECONDS
    # The exponent is bounded before the power: a row sent for days has many copies.
    doublings = min(max(copies - 1, 0), 32)
    return timedelta(seconds=min(first * 2**doublings, max(first, settings.RFT_DISPATCH_RESEND_MAX_SECONDS)))


def dispatch_lost(*, dispatch: Dispatch, now: datetime, beat: WorkerHeartbeat | None) -> Lost | None:
    """Why `dispatch` will not end by itself, or None while it may (see the module docstring)."""
    dead = timedelta(seconds=settings.RFT_WORKER_DEAD_SECONDS)
    if dispatch.state == Dispatch.State.SENT:
        if dispatch.sent_at is None or now - dispatch.sent_at > resend_wait(copies=dispatch.copies):
            return Lost("no worker picked its message up", release=False)
        return None
    if dispatch.state != Dispatch.State.RUNNING:
        return None
    started = dispatch.started_at or now
    if dispatch.job == Dispatch.Job.TRAIN:
        # The lock is taken right after the task begins and held until just before it ends.
        if now - started < timedelta(seconds=settings.RFT_HEARTBEAT_SECONDS * 2):
            return None
        return None if _trainer_lock_held(dispatch.run_id) else Lost("no trainer holds the run", release=True)
    if beat is None:
        # A worker that writes no heartbeat (a task run by hand): only time tells.
        if now - started > timedelta(seconds=settings.RFT_DISPATCH_TTL):
            return Lost("its worker sent no heartbeat", release=True)
        return None
    if beat.stopped_at is not None or beat.started_at > started:
        return Lost("its worker stopped or restarted", release=True)
    if now - beat.last_seen > dead:
        return Lost("its worker's heartbeat stopped", release=True)
    if now - started > dead and dispatch.task_id not in {a.get("id") for a in beat.active or []}:
        return Lost("its worker is no longer running it", release=False)
    return None


def _resend(*, run: Run, dispatch: Dispatch, copies: int) -> None:
    """Queue `dispatch`'s message again, the row already updated to `copies` copies. A broker
    that is away queued nothing: the row goes back to the copies and send time it had, so the
    next beat tries again at once rather than after a longer wait for a copy never sent."""
    name, queue = _TASKS[Dispatch.Job(dispatch.job)]
    try:
        _send(name, [run.pk, dispatch.step], queue, dispatch.task_id)
    except Exception:
        Dispatch.objects.filter(pk=dispatch.pk, state=Dispatch.State.SENT, task_id=dispatch.task_id,
                                copies=copies).update(copies=copies - 1, sent_at=dispatch.sent_at)
        raise


def dispatch_recover(*, run: Run, now: datetime | None = None, busy: set[str] | None = None,
                     jobs: tuple[str, ...] | None = None) -> list[str]:
    """Take back the run's dispatches (of `jobs`, default all) that will not end by
    themselves and send them again under their task id; a dead worker's leases go back to
    the buffer first. `busy` gets the jobs that are out (sent or running, recovered or not)
    as read here."""
    now = now or timezone.now()
    out: list[str] = []
    # Only the jobs the conductor sends (_TASKS); the other jobs' rows go by their lease.
    rows = list(Dispatch.objects.filter(run=run, job__in=_TASKS if jobs is None else jobs)
                .exclude(state=Dispatch.State.IDLE))
    if busy is not None:
        busy.update(str(d.job) for d in rows)
    if not rows:
        return out
    # Only a running explore-side step is judged by its worker's heartbeat (a sent one by its
    # age, a train step by the trainer's lock): the beat reads no heartbeats otherwise.
    hosts = [d.worker for d in rows if d.worker and d.state == Dispatch.State.RUNNING
             and d.job != Dispatch.Job.TRAIN]
    beats = {b.hostname: b for b in WorkerHeartbeat.objects.filter(hostname__in=hosts)} if hosts else {}
    for d in rows:
        lost = dispatch_lost(dispatch=d, now=now, beat=beats.get(d.worker))
        if lost is None:
            continue
        # A sent row gets one more copy of its message; a running one taken back from its
        # worker was picked up, so its copies start again (the next waits the shortest time).
        copies = d.copies + 1 if d.state == Dispatch.State.SENT else 1
        taken = Dispatch.objects.filter(pk=d.pk, state=d.state, task_id=d.task_id, started_at=d.started_at,
                                        copies=d.copies).update(
            state=Dispatch.State.SENT, worker="", holder="", sent_at=now, started_at=None, sends=F("sends") + 1,
            copies=copies,
        )
        if not taken:
            continue  # it moved on meanwhile, or another conductor took it
        if lost.release and d.holder:
            if d.job == Dispatch.Job.TRAIN:
                batch_release(run=run, worker=d.holder)
            elif d.job == Dispatch.Job.EXPLORE:
                task_release(run=run, worker=d.holder)
        log.warning("run %s: %s step %s sent again (copy %d): %s", run.pk, d.job, d.step, copies, lost.reason)
        _resend(run=run, dispatch=d, copies=copies)
        out.append(f"{d.job}:{d.step} again")
    return out


# ----------------------------------------------------------------------------- advance


@dataclass
class Advance:
    keep_going: bool
    dispatched: list[str] = field(default_factory=list)
    finished: bool = False


_last_reap = float("-inf")


def _lease_reap_due() -> bool:
    """Whether this process's `run_advance` should reap expired leases now. Leases last
    RFT_LEASE_SECONDS (300 s by default): reaping at most every twentieth of that returns a
    dead worker's rows at most 5% of a lease late, where reaping on every beat and every
    step (two table-wide UPDATEs each time) was a third of an idle beat's statements."""
    global _last_reap
    now = time.monotonic()
    if now - _last_reap < settings.RFT_LEASE_SECONDS / 20:
        return False
    _last_reap = now
    return True


def run_advance(*, run: Run, train: bool = True, fresh: bool = False) -> Advance:
    """Send every step of `run` that may go now; say whether the run goes on.

    train=False: explore steps only (a trainer that goes on to its next step itself).
    fresh=True: `run` was read from the database just now (the loop's beat), not again."""
    if not fresh:
        run.refresh_from_db()
    if run.status != Run.Status.RUNNING:
        return Advance(keep_going=False)
    cfg = run.cfg
    if run.current_version == 0:
        # Once a version is out, version 0 was recorded by an earlier advance.
        _, created = ModelVersion.objects.get_or_create(run=run, number=0,
                                                        defaults={"checkpoint": cfg.model, "train_step": 0})
        if created and cfg.eval_every and cfg.eval.taskset is not None:
            # Version 0 is evaluated too (at step 0): a run's gains, and its twin's, start from
            # the model it started from, and that model may stay the best version.
            run_id = run.pk
            transaction.on_commit(lambda: eval_dispatch(run_id=run_id, version=0))
    # Dead explorers' and trainers' leases come back here too, not only on the beat.
    if _lease_reap_due():
        lease_reap()
    busy: set[str] = set()
    out = Advance(keep_going=True, dispatched=dispatch_recover(run=run, busy=busy))

    explore_done = True
    if schedule.explores(cfg) and run.explore_step < cfg.total_steps:
        explore_done = False
        k = run.explore_step + 1
        # A step already out (sent or running, seen just now): sending would find the row taken.
        if Dispatch.Job.EXPLORE not in busy and (
            schedule.explore_version(cfg=cfg, explore_step=k, current_version=run.current_version) is not None
        ):
            if dispatch_send(run=run, job=Dispatch.Job.EXPLORE, step=k):
                out.dispatched.append(f"explore:{k}")

    if not train:
        return out
    train_done = True
    if schedule.trains(cfg):
        expected = schedule.version_for_train_step(cfg=cfg, train_step=run.train_step)
        if run.train_step > 0 and schedule.publishes_at(cfg=cfg, train_step=run.train_step) and run.current_version < expected:
            # A trainer died between its step and publishing: the same step again publishes.
            train_done = False
            if Dispatch.Job.TRAIN not in busy and dispatch_send(run=run, job=Dispatch.Job.TRAIN, step=run.train_step):
                out.dispatched.append(f"publish:{run.train_step}")
        elif run.train_step < cfg.total_steps and Dispatch.Job.TRAIN in busy:
            # A step is out (in async mode the trainer goes on to the next one itself): the
            # run is not done, and whether a batch is there is the trainer's question now.
            # Not counting the buffer here halves an async beat's statements.
            train_done = False
        elif run.train_step < cfg.total_steps:
            readiness = train_readiness(run=run)
            if readiness.ready:
                train_done = False
                t = run.train_step + 1
                if Dispatch.Job.TRAIN not in busy and dispatch_send(run=run, job=Dispatch.Job.TRAIN, step=t):
                    out.dispatched.append(f"train:{t}")
            elif not readiness.final:
                train_done = False
    if explore_done and train_done and not _in_flight(run):
        run_finish(run=run)
        return Advance(keep_going=False, dispatched=out.dispatched, finished=True)
    return out


def run_advance_after_step(*, run: Run, train: bool = True) -> None:
    """`run_advance` from an explorer or trainer that has just ended a step (and its hold):
    send what the step unblocked now rather than at the loop's next beat (in async mode that
    hop is what keeps the two sides overlapping). A failure is logged, never the step's."""
    try:
        run_advance(run=run, train=train)
    except Exception:
        log.exception("run %s: could not dispatch after a step", run.pk)


def train_step_continue(*, run: Run, step: int) -> TrainReadiness | None:
    """A trainer that has just finished step - 1 asks whether to go on with `step` itself,
    without the round trip through the queue: its readiness when the step is due and its
    batch is there, else None (the loop sends it when it can go). The trainer then moves
    its dispatch row on to the step (`DispatchHold.move_to`), so the loop does not send it."""
    run.refresh_from_db()
    cfg = run.cfg
    if run.status != Run.Status.RUNNING or step != run.train_step + 1 or step > cfg.total_steps:
        return None
    if run.current_version < schedule.version_for_train_step(cfg=cfg, train_step=run.train_step):
        return None  # the last step's version is not out yet; the re-dispatch publishes it
    readiness = train_readiness(run=run)
    return readiness if readiness.ready else None


def _in_flight(run: Run) -> bool:
    return (
        TaskAttempt.objects.filter(run=run, status=TaskAttempt.Status.LEASED).exists()
        or Experience.objects.filter(run=run, status=Experience.Status.LEASED).exists()
    )


def run_finish(*, run: Run) -> None:
    """Every step the config asks for is done (or, offline, the buffer is used up): finished."""
    try:
        run_transition(run=run, action="finish")
    except TransitionNotAllowed:
        pass


# ----------------------------------------------------------------------------- the loop


def conductor_beat() -> dict[int, Advance]:
    """One beat of the RFT core's loop: every running run advanced (and its lost dispatches
    taken back). A run that fails its beat is logged; the others go on."""
    out: dict[int, Advance] = {}
    for run in Run.objects.filter(status=Run.Status.RUNNING):
        try:
            out[run.pk] = run_advance(run=run, fresh=True)
        except Exception:
            log.exception("conductor: run %s failed its beat; the next beat tries again", run.pk)
            continue
        if out[run.pk].dispatched:
            log.info("run %s: dispatched %s", run.pk, ", ".join(out[run.pk].dispatched))
    return out
