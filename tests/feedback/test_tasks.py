"""The periodic feedback task, run by a real Celery worker on the Redis broker."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.contrib.auth.models import User

from apps.buffer.models import Experience
from apps.buffer.services import experience_write
from apps.feedback.services import feedback_rate
from apps.feedback.tasks import feedback_wait_expire_task
from rftweb.celery import app
from tests.factories import experience_row, make_run
from tests.feedback.conftest import server_env

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


@pytest.fixture(scope="module")
def celery_worker(django_db_setup: None, django_db_blocker) -> Iterator[None]:
    with django_db_blocker.unblock():
        env = server_env()
    app.control.purge()
    proc = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "rftweb", "worker", "-P", "solo", "-Q", "default", "-c", "1",
         "--without-heartbeat", "--without-gossip", "--without-mingle", "-n", f"feedback-test-{time.time_ns()}@%h"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    yield
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()


def test_the_beat_schedules_the_wait_window_sweep() -> None:
    tasks = {entry["task"] for entry in app.conf.beat_schedule.values()}
    assert {"apps.feedback.tasks.feedback_wait_expire_task", "apps.feedback.tasks.assignment_reap_task"} <= tasks


def test_a_celery_worker_ends_wait_windows_with_the_fallback(celery_worker: None, owner: User) -> None:
    waiting = make_run(owner=owner, name="waits", feedback={"mode": "blend", "wait_seconds": 0, "fallback": "auto"})
    dropping = make_run(owner=owner, name="drops", feedback={"mode": "human", "wait_seconds": 0, "fallback": "drop"})
    patient = make_run(owner=owner, name="patient", feedback={"mode": "human", "wait_seconds": 3600})
    ids = {}
    for run in (waiting, dropping, patient):
        rows = [experience_row(run, key=f"{run.name}-{i}", group=run.name, status="pending", auto_reward=float(i), reward=None)
                for i in range(2)]
        ids[run.name] = experience_write(experiences=rows).ids
    feedback_rate(run=waiting, author=owner, experience=ids["waits"][0], score=5)

    feedback_wait_expire_task.apply_async(queue="default")
    deadline = time.monotonic() + 60
    while Experience.objects.filter(run__in=[waiting, dropping], status="pending").exists():
        assert time.monotonic() < deadline, "the worker did not end the wait windows"
        time.sleep(0.2)

    got = {e.pk: (e.status, e.reward) for e in Experience.objects.all()}
    assert [got[pk] for pk in ids["waits"]] == [("ready", 0.5 * 0.0 + 0.5 * 1.0), ("ready", 1.0)]
    assert {got[pk][0] for pk in ids["drops"]} == {"filtered"}
    assert {got[pk][0] for pk in ids["patient"]} == {"pending"}
