"""The periodic feedback task, run by a real Celery worker on the Redis broker."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User

from apps.buffer.models import Experience
from apps.buffer.services import experience_write
from apps.feedback.kinds.rating import feedback_rate
from apps.feedback.tasks import feedback_wait_expire_task
from rftweb.celery import app
from tests.factories import experience_row, make_run
from tests.servers import celery_worker

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


@pytest.fixture(scope="module")
def default_worker(django_db_setup: None, django_db_blocker: Any) -> Iterator[None]:
    with django_db_blocker.unblock(), celery_worker("default", name="feedback-test"):
        yield


def test_the_beat_schedules_the_wait_window_sweep() -> None:
    tasks = {entry["task"] for entry in app.conf.beat_schedule.values()}
    assert {"apps.feedback.tasks.feedback_wait_expire_task", "apps.feedback.tasks.assignment_reap_task"} <= tasks


def test_a_celery_worker_ends_wait_windows_with_the_fallback(default_worker: None, owner: User) -> None:
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
