"""The run modes through the real loop: the conductor and the trainer as Celery workers,
Postgres, Redis. The explorer's side is played by `Explorer` below, which explores a step
exactly when `apps.runs.schedule` lets it (what `workers.explore.explorer.explore_step` does) and
writes through `experience_write`; the explorer issue's own tests cover the real one.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
from django.conf import settings

from apps.buffer.models import Experience
from apps.buffer.services import experience_write
from apps.runs import schedule
from apps.runs.models import Dispatch, Metric, ModelVersion, Run
from apps.runs.services import run_transition
from tests.factories import experience_row, make_run, make_taskset

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


class Explorer:
    """Explores steps (2 tasks × 4 samples each) as far ahead as the policy lets it, each with
    the version the policy names: as fast an explorer as there can be, so that how far async
    runs ahead depends on the policy alone, not on how fast the trainer happens to be."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.log: list[tuple[int, int, int]] = []  # (step, version used, trainer's version then)

    def tick(self) -> None:
        while self._step():
            pass

    def _step(self) -> bool:
        run = Run.objects.get(pk=self.run.pk)
        if run.status != Run.Status.RUNNING or run.explore_step >= run.cfg.total_steps:
            return False
        k = run.explore_step + 1
        version = schedule.explore_version(cfg=run.cfg, explore_step=k, current_version=run.current_version)
        if version is None:
            return False
        rows = [
            experience_row(run, key=f"s{k}g{g}-{i}", group=f"s{k}g{g}", prompt_len=3 + g, response_len=2 + i,
                           reward=float(i % 2), model_version=version)
            for g in range(2) for i in range(4)
        ]
        experience_write(experiences=rows)
        Run.objects.filter(pk=run.pk, explore_step=k - 1).update(explore_step=k)
        self.log.append((k, version, run.current_version))
        return True


def drive(run: Run, until: Callable[[Run], bool], *, explorer: Explorer | None, timeout: float = 300.0) -> Run:
    # Generous: a trainer's first step (loading the model and the learner) took up to two
    # minutes on a 2-core host shared with other test runs.
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run.refresh_from_db()
        if until(run):
            return run
        if run.status == Run.Status.FAILED:
            raise AssertionError(f"run failed: {run.error}")
        if explorer is not None:
            explorer.tick()
        time.sleep(0.2)
    raise AssertionError(f"timed out: status={run.status} explore={run.explore_step} train={run.train_step} v={run.current_version}")


def _train_dispatch_idle(run: Run, *, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    out = Dispatch.objects.filter(run=run, job=Dispatch.Job.TRAIN).exclude(state=Dispatch.State.IDLE)
    while out.exists():
        assert time.monotonic() < deadline, f"a train task still out {timeout:.0f} s after the pause: {list(out.values())}"
        time.sleep(0.2)


def _beats_seen(owner: Any, model_dir: Path, *, beats: int) -> None:
    """Wait for `beats` whole beats of the conductor's loop, each seen through its effect: a
    train-mode run with no batch, made running after the last one ended, is finished by the
    first beat that reads it (it touches no queue and no other run). What a paused run's
    stillness is checked against, instead of a guessed 4 s that a loaded host may not fill."""
    from tests.trainer.conftest import running_run

    for _ in range(beats):
        beat = running_run(owner, model_dir, total_steps=1)
        drive(beat, lambda r: r.status == Run.Status.FINISHED, explorer=None, timeout=120)


def _run(owner: Any, model_dir: Path, **config: Any) -> Run:
    base: dict[str, Any] = {"model": str(model_dir), "train_batch_size": 8, "explore_batch_size": 2, "repeat_times": 4,
            "total_steps": 3, "trainer": {"learning_rate": 1e-3, "loss_type": "grpo"}}
    base.update(config)
    return make_run(owner=owner, taskset=make_taskset(owner=owner), **base)


def _staleness(run: Run) -> list[float]:
    return list(Metric.objects.filter(run=run, name="staleness").order_by("step").values_list("value", flat=True))


def test_sync_mode_trains_each_step_on_the_previous_versions_experiences_only(
    owner: Any, tiny_model_dir: Path, celery_workers: Any
) -> None:
    run = _run(owner, tiny_model_dir, mode="sync", sync_interval=1, sync_offset=0)
    explorer = Explorer(run)
    run_transition(run=run, action="start", actor=owner)
    run = drive(run, lambda r: r.status == Run.Status.FINISHED, explorer=explorer)
    assert run.train_step == 3 and run.current_version == 3
    # Explore step k used v(k-1): each waited for the version trained on the step before.
    assert [(k, v) for k, v, _ in explorer.log] == [(1, 0), (2, 1), (3, 2)]
    assert _staleness(run) == [0.0, 0.0, 0.0]
    assert set(Experience.objects.filter(run=run).values_list("status", "use_count")) == {("consumed", 1)}
    assert list(ModelVersion.objects.filter(run=run).values_list("number", flat=True)) == [0, 1, 2, 3]


def test_async_mode_never_runs_ahead_more_than_max_staleness(owner: Any, tiny_model_dir: Path, celery_workers: Any) -> None:
    run = _run(owner, tiny_model_dir, mode="async", max_staleness=1, total_steps=5)
    explorer = Explorer(run)
    run_transition(run=run, action="start", actor=owner)
    run = drive(run, lambda r: r.status == Run.Status.FINISHED, explorer=explorer, timeout=300)
    assert run.train_step == 5
    # The explorer got ahead (it did not wait for every version) but never by more than one.
    assert any(trainer_v < k - 1 for k, _, trainer_v in explorer.log)
    assert all((k - 1) - v <= 1 for k, v, _ in explorer.log)
    assert max(_staleness(run)) <= 1
    assert set(Experience.objects.filter(run=run).values_list("status", "use_count")) == {("consumed", 1)}


def test_pause_stops_the_explorer_and_the_trainer_and_resume_goes_on(
    owner: Any, tiny_model_dir: Path, celery_workers: Any
) -> None:
    run = _run(owner, tiny_model_dir, mode="async", max_staleness=2, total_steps=4)
    explorer = Explorer(run)
    run_transition(run=run, action="start", actor=owner)
    run = drive(run, lambda r: r.train_step >= 1, explorer=explorer)
    run_transition(run=run, action="pause", actor=owner)
    # A train step in flight at the pause may still finish (and one sent may still be taken
    # and refused): wait for the run's train dispatch to be idle, not for a guessed 1.5 s,
    # which a loaded host overran (the step then landed inside the still window below).
    _train_dispatch_idle(run)
    broker = redis.Redis.from_url(settings.REDIS_URL)
    run.refresh_from_db()
    steps, explored, dispatched = run.train_step, run.explore_step, broker.llen("rollout")
    # Ready experiences are waiting, yet nothing moves while paused.
    experience_write(experiences=[experience_row(run, key=f"late{i}", group="late", reward=float(i % 2)) for i in range(4)])
    _beats_seen(owner, tiny_model_dir, beats=3)
    run.refresh_from_db()
    assert (run.train_step, run.explore_step) == (steps, explored)
    assert broker.llen("rollout") == dispatched, "the conductor dispatched explore steps of a paused run"
    assert Experience.objects.filter(run=run, status="leased").count() == 0
    run_transition(run=run, action="resume", actor=owner)
    run = drive(run, lambda r: r.status == Run.Status.FINISHED, explorer=explorer)
    assert run.train_step == 4


def test_killing_every_worker_and_restarting_continues_from_the_latest_version(
    owner: Any, tiny_model_dir: Path, celery_workers: Any
) -> None:
    run = _run(owner, tiny_model_dir, mode="sync", sync_interval=1, total_steps=5)
    explorer = Explorer(run)
    run_transition(run=run, action="start", actor=owner)
    run = drive(run, lambda r: r.train_step >= 2, explorer=explorer)
    explorer.tick()  # the next step's experiences are in the buffer, likely being trained on now
    celery_workers.kill_all()
    killed_at = Run.objects.get(pk=run.pk)
    time.sleep(1)
    celery_workers.start_together(("conductor", "default", (), True), ("trainer", "train", ("workers.trainer",), False))
    run = drive(run, lambda r: r.status == Run.Status.FINISHED, explorer=explorer, timeout=300)
    assert run.train_step == 5 and run.current_version == 5
    assert run.current_version >= killed_at.current_version
    # Every experience trained on exactly once, and each step's batch is one explore step's.
    assert set(Experience.objects.filter(run=run).values_list("status", "use_count")) == {("consumed", 1)}
    claimed = list(Metric.objects.filter(run=run, name="claimed").order_by("step").values_list("step", "value"))
    assert claimed == [(s, 8.0) for s in range(1, 6)]
    assert list(ModelVersion.objects.filter(run=run).values_list("number", flat=True)) == [0, 1, 2, 3, 4, 5]
    assert _staleness(run) == [0.0] * 5
