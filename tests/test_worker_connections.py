"""Celery workers keep their database connection from one task to the next
(RFT_WORKER_CONN_MAX_AGE), on a real worker and Postgres."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection

from apps.runs.models import Run
from apps.control.tasks import run_announce
from tests.factories import make_run
from tests.servers import celery_worker

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def _backend_that_ran(run: Run, send: Callable[[], Any]) -> int:
    """The Postgres backend whose latest query was the buffer count that `send` asks for."""
    since = time.time()
    send()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with connection.cursor() as cur:
            cur.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() "
                "AND query LIKE %s AND query_start >= to_timestamp(%s)",
                [f'%buffer_experience%"run_id" = {run.pk}%', since],
            )
            row = cur.fetchone()
        if row:
            return int(row[0])
        time.sleep(0.1)
    raise AssertionError("the worker never ran the task")


def test_a_worker_keeps_its_database_connection_from_one_task_to_the_next(owner: Any) -> None:
    run = make_run(owner=owner)
    with celery_worker("default", name="conn"):
        first = _backend_that_ran(run, lambda: run_announce.delay(run.pk))
        second = _backend_that_ran(run, lambda: run_announce.delay(run.pk))
    # Without reuse the first backend is gone once its task ends, and the second task's is new.
    assert first == second



class _Task:
    """What the connection signal handlers read of a task: it is not run eagerly."""

    class request:
        is_eager = False


def test_a_task_right_after_another_skips_the_health_check_round_trip(settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A kept connection is checked (`SELECT 1`) before a task's first query only when the
    worker has been idle a while, or the connection errored: back-to-back rollout tasks
    (OpenAI chat calls) would pay a round trip each for nothing."""
    from rftweb import celery as celery_app

    settings.RFT_WORKER_CONN_MAX_AGE = 300
    settings.RFT_WORKER_HEALTH_CHECK_IDLE_SECONDS = 2.0
    # What worker_process_init sets in a worker; this test process is a web-side one (age 0).
    monkeypatch.setitem(connection.settings_dict, "CONN_MAX_AGE", 300)
    connection.ensure_connection()
    connection.health_check_enabled = True  # type: ignore[attr-defined]
    checks: list[bool] = []
    real = connection.is_usable

    def counted() -> bool:
        checks.append(True)
        return real()

    monkeypatch.setattr(connection, "is_usable", counted)

    def task() -> None:
        celery_app._connections_before_task(sender=_Task)
        with connection.cursor() as cur:
            cur.execute("SELECT 1")
        celery_app._connections_after_task(sender=_Task)

    task()  # the first after a long idle time: checked
    assert len(checks) == 1
    task()
    task()
    assert len(checks) == 1
    monkeypatch.setattr(celery_app, "_last_task_end", [time.monotonic() - 10])
    celery_app._connections_before_task(sender=_Task)
    with connection.cursor() as cur:
        cur.execute("SELECT 1")
    assert len(checks) == 2
    connection.errors_occurred = True
    celery_app._connections_before_task(sender=_Task)  # errored: checked whatever the age
    assert len(checks) == 3
