"""The RFT core's conductor: decide, from the database alone, which explore and train steps
of a running run can go now, and enqueue them on their queues.

Nothing here holds state the database does not: a conductor can die and another pick up;
after a full restart `runs_resume` starts one per running run and the run goes on from its
latest version with its buffer intact. Duplicate dispatches are harmless (the explorer and
trainer tasks are idempotent); dispatch markers in Redis only keep them rare.

The web side may import this module: no torch, no TRL (tasks are sent by name).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.utils import timezone

from apps.buffer.models import Experience, TaskAttempt
from apps.buffer.selectors import experiences_claimable, experiences_in_whole_groups
from apps.runs import policy
from apps.runs.models import ModelVersion, Run

log = logging.getLogger(__name__)

EXPLORE_TASK = "workers.explorer.explore_step"
TRAIN_TASK = "workers.trainer.train_step"
CONDUCT_TASK = "apps.runs.conduct.run_conduct"


# ----------------------------------------------------------------------------- markers


class _Markers:
    """Short-lived keys shared by every process: Redis when configured, else this process
    (the embedded default runs everything in one)."""

    def __init__(self) -> None:
        self._local: dict[str, tuple[str, float]] = {}
        self._lock = threading.Lock()
        self._client: Any = None

    def _redis(self) -> Any:
        if not settings.REDIS_URL:
            return None
        if self._client is None:
            import redis

            self._client = redis.Redis.from_url(settings.REDIS_URL)
        return self._client

    def add(self, key: str, value: str, ttl: float) -> bool:
        """Set key if absent (True), else leave it (False)."""
        r = self._redis()
        if r is not None:
            return bool(r.set(key, value, nx=True, px=max(1, int(ttl * 1000))))
        with self._lock:
            now = time.monotonic()
            held = self._local.get(key)
            if held and held[1] > now:
                return False
            self._local[key] = (value, now + ttl)
            return True

    def get(self, key: str) -> str | None:
        r = self._redis()
        if r is not None:
            raw = r.get(key)
            return raw.decode() if raw is not None else None
        with self._lock:
            held = self._local.get(key)
            return held[0] if held and held[1] > time.monotonic() else None

    def touch(self, key: str, ttl: float) -> None:
        r = self._redis()
        if r is not None:
            r.pexpire(key, max(1, int(ttl * 1000)))
            return
        with self._lock:
            if key in self._local:
                self._local[key] = (self._local[key][0], time.monotonic() + ttl)

    def delete(self, key: str) -> None:
        r = self._redis()
        if r is not None:
            r.delete(key)
            return
        with self._lock:
            self._local.pop(key, None)

    def delete_prefix(self, prefix: str) -> None:
        r = self._redis()
        if r is not None:
            keys = list(r.scan_iter(match=f"{prefix}*", count=500))
            if keys:
                r.delete(*keys)
            return
        with self._lock:
            for key in [k for k in self._local if k.startswith(prefix)]:
                del self._local[key]


markers = _Markers()


def _prefix(run_id: int) -> str:
    return f"{getattr(settings, 'CHANNELS_PREFIX', 'rftweb')}:rft:run:{run_id}:"


def _dispatch_ttl() -> float:
    return float(getattr(settings, "RFT_DISPATCH_TTL", 120.0))


def _conduct_seconds() -> float:
    return float(getattr(settings, "RFT_CONDUCT_SECONDS", 0.5))


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


@dataclass(frozen=True)
class BatchPlan:
    """What a train step claims: how many of the model's own rollouts (whole groups or
    not), how many expert ones."""

    usual: int
    expert: int
    whole_groups: bool

    @property
    def size(self) -> int:
        return self.usual + self.expert


def batch_plan(*, cfg: Any) -> BatchPlan:
    algo = str(getattr(cfg.algorithm, "value", cfg.algorithm))
    size = cfg.train_batch_size
    if algo == "sft":
        return BatchPlan(usual=0, expert=size, whole_groups=False)
    if algo == "mix":
        expert = min(size - 1, round(cfg.trainer.expert_share * size)) if size > 1 else 0
        return BatchPlan(usual=size - expert, expert=expert, whole_groups=True)
    # grpo: advantages are group-relative; dpo: pairs are drawn within a group.
    return BatchPlan(usual=size, expert=0, whole_groups=True)


def explore_finished(*, run: Run) -> bool:
    """No more experiences will come from the explorer for this run."""
    cfg = run.cfg
    if not policy.explores(cfg):
        return True
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
    min_version = policy.min_version_for_claim(cfg=cfg, current_version=run.current_version)
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
    algo = str(getattr(cfg.algorithm, "value", cfg.algorithm))
    if algo == "mix":
        # The expert part is optional (a missing side adds nothing); the usual part sets the pace.
        full = usual >= plan.usual
        some = usual > 0 or expert > 0
    elif plan.expert:
        full, some = expert >= plan.expert, expert > 0
    else:
        full, some = usual >= plan.usual, usual > 0
    return TrainReadiness(ready=full or (final and some), final=final, usual=usual, expert=expert, min_version=min_version)


# ----------------------------------------------------------------------------- advance


@dataclass
class Advance:
    keep_going: bool
    dispatched: list[str] = field(default_factory=list)
    finished: bool = False


def _send(name: str, args: list[Any], queue: str) -> None:
    from rftweb.celery import app

    app.send_task(name, args=args, queue=queue)


def _dispatch(run: Run, kind: str, step: int, name: str, queue: str) -> bool:
    key = f"{_prefix(run.pk)}{kind}:{step}"
    if not markers.add(key, str(time.time()), _dispatch_ttl()):
        return False
    _send(name, [run.pk, step], queue)
    return True


def run_advance(*, run: Run, train: bool = True) -> Advance:
    """Enqueue every step of `run` that may go now; say whether to keep conducting.

    train=False: explore steps only (a trainer that goes on to its next step itself)."""
    from apps.buffer.services import lease_reap

    run.refresh_from_db()
    if run.status != Run.Status.RUNNING:
        return Advance(keep_going=False)
    cfg = run.cfg
    ModelVersion.objects.get_or_create(run=run, number=0, defaults={"checkpoint": cfg.model, "train_step": 0})
    # Dead explorers' and trainers' leases come back here too, not only on the beat.
    lease_reap()
    out = Advance(keep_going=True)

    explore_done = True
    if policy.explores(cfg) and run.explore_step < cfg.total_steps:
        explore_done = False
        k = run.explore_step + 1
        if policy.explore_version(cfg=cfg, explore_step=k, current_version=run.current_version) is not None:
            if _dispatch(run, "explore", k, EXPLORE_TASK, "rollout"):
                out.dispatched.append(f"explore:{k}")

    if not train:
        return out
    train_done = True
    if policy.trains(cfg):
        expected = policy.version_for_train_step(cfg=cfg, train_step=run.train_step)
        if run.train_step > 0 and policy.publishes_at(cfg=cfg, train_step=run.train_step) and run.current_version < expected:
            # A trainer died between its step and publishing: the same step again publishes.
            train_done = False
            if _dispatch(run, "train", run.train_step, TRAIN_TASK, "train"):
                out.dispatched.append(f"publish:{run.train_step}")
        elif run.train_step < cfg.total_steps:
            readiness = train_readiness(run=run)
            if readiness.ready:
                train_done = False
                t = run.train_step + 1
                if _dispatch(run, "train", t, TRAIN_TASK, "train"):
                    out.dispatched.append(f"train:{t}")
            elif not readiness.final:
                train_done = False
    if explore_done and train_done and not _in_flight(run):
        run_finish(run=run)
        return Advance(keep_going=False, dispatched=out.dispatched, finished=True)
    return out


def run_advance_after_step(*, run: Run, train: bool = True) -> None:
    """`run_advance` from an explorer or trainer that has just finished a step: dispatch what
    the step unblocked now rather than at the conductor's next beat (in async mode that hop
    is what keeps the two sides from overlapping). The dispatch markers keep it from
    doubling what the conductor sends; a failure is logged, never the step's."""
    try:
        run_advance(run=run, train=train)
    except Exception:
        log.exception("run %s: could not dispatch after a step", run.pk)


def train_step_continue(*, run: Run, step: int) -> TrainReadiness | None:
    """A trainer that has just finished step - 1 asks to go on with `step` itself, without
    the round trip through the queue. Its readiness when the step is due, its batch is there
    and no one dispatched it (the dispatch marker becomes the trainer's, so the conductor
    does not send it too); else None, and the conductor dispatches it as usual."""
    run.refresh_from_db()
    cfg = run.cfg
    if run.status != Run.Status.RUNNING or step != run.train_step + 1 or step > cfg.total_steps:
        return None
    if run.current_version < policy.version_for_train_step(cfg=cfg, train_step=run.train_step):
        return None  # the last step's version is not out yet; the re-dispatch publishes it
    readiness = train_readiness(run=run)
    if not readiness.ready:
        return None
    if not markers.add(f"{_prefix(run.pk)}train:{step}", str(time.time()), _dispatch_ttl()):
        return None
    return readiness


def train_dispatch_forget(*, run_id: int, step: int) -> None:
    """A trainer will not train `step`, which it took over (train_step_continue) or was sent
    while another task held the run: the conductor may dispatch it again at its next beat."""
    markers.delete(f"{_prefix(run_id)}train:{step}")


def _in_flight(run: Run) -> bool:
    return (
        TaskAttempt.objects.filter(run=run, status=TaskAttempt.Status.LEASED).exists()
        or Experience.objects.filter(run=run, status=Experience.Status.LEASED).exists()
    )


def run_finish(*, run: Run) -> None:
    """Every step the config asks for is done (or, offline, the buffer is used up): finished."""
    from apps.runs.services import TransitionNotAllowed, run_transition

    try:
        run_transition(run=run, action="finish")
    except TransitionNotAllowed:
        pass


# ----------------------------------------------------------------------------- conductor chain


def conduct_tick(*, run_id: int, token: str) -> bool:
    """One beat of a run's conductor: True when the chain should go on. Only one chain per
    run runs at a time: it owns a marker with its token; a second chain finds it and ends."""
    key = f"{_prefix(run_id)}conductor"
    ttl = max(10.0, _conduct_seconds() * 20)
    owner = markers.get(key)
    if owner is None:
        if not markers.add(key, token, ttl):
            return False
    elif owner != token:
        return False
    else:
        markers.touch(key, ttl)
    run = Run.objects.filter(pk=run_id).first()
    if run is None:
        return False
    try:
        advance = run_advance(run=run)
    except Exception:
        log.exception("conductor of run %s failed a beat; it goes on", run_id)
        return True
    if advance.dispatched:
        log.info("run %s: dispatched %s", run_id, ", ".join(advance.dispatched))
    if not advance.keep_going:
        markers.delete_prefix(key)
    return advance.keep_going


def conduct_kick(*, run_id: int) -> str:
    """Start a conductor chain for the run (a no-op beat when one already runs)."""
    token = uuid.uuid4().hex
    try:
        _send(CONDUCT_TASK, [run_id, token], "default")
    except Exception:  # the broker being down must not fail a start; the beat resumes the run
        log.exception("could not start the conductor of run %s", run_id)
    return token


def runs_resume(*, clear_markers: bool = False) -> list[int]:
    """After a restart: a conductor for every running run. With clear_markers, forget what
    was dispatched before, since those tasks died with their workers."""
    ids = list(Run.objects.filter(status=Run.Status.RUNNING).values_list("pk", flat=True))
    for run_id in ids:
        if clear_markers:
            markers.delete_prefix(_prefix(run_id))
        conduct_kick(run_id=run_id)
    return ids


def conduct_next(*, run_id: int, token: str) -> None:
    from rftweb.celery import app

    app.send_task(CONDUCT_TASK, args=[run_id, token], queue="default", countdown=_conduct_seconds())
