"""The web process borrows Postgres connections from a bounded pool (RFT_DB_POOL_SIZE):
many concurrent requests through a live server hold no more than the pool, answer no 5xx,
and leave no idle connection behind once the load ends (issue #33)."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.db import connection

from tests.servers import start_uvicorn, stop

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


APP_NAME = "rft-web-connections-test"  # the server's connections carry it (libpq's PGAPPNAME)


def server_connections() -> int:
    """Connections the server under test holds: other tests' leftovers and this process's
    own threads are not counted."""
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND application_name = %s", [APP_NAME])
        row = cur.fetchone()
    return int(row[0]) if row else 0


async def _requests(url: str, count: int) -> list[int]:
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        # /ready/: a query through the pool (/health/ is liveness and asks no database).
        answers = await asyncio.gather(*(client.get("/ready/") for _ in range(count)))
    return [a.status_code for a in answers]


def test_sixty_concurrent_requests_hold_at_most_the_pool_and_release_it_after(tmp_path: Path) -> None:
    # An idle time long enough that the pool does not shrink between the bursts: a backend it
    # closes lingers in pg_stat_activity a moment while its replacement is already counted.
    proc, url = start_uvicorn(log=tmp_path / "server.log", RFT_DB_POOL_SIZE="4", RFT_DB_POOL_MAX_IDLE="2",
                              PGAPPNAME=APP_NAME)
    try:
        peak = [0]
        done = threading.Event()

        def watch() -> None:
            from django.db import connection as own

            while not done.is_set():
                peak[0] = max(peak[0], server_connections())
                time.sleep(0.05)
            own.close()

        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            statuses = [s for _ in range(3) for s in asyncio.run(_requests(url, 60))]
        finally:
            done.set()
            watcher.join()

        assert statuses.count(200) == 180, sorted(set(statuses))
        # Without the pool every concurrent request opened one (issue #33: 94 held).
        assert 1 <= peak[0] <= 4, peak[0]
        # The pool closes unused connections, one each RFT_DB_POOL_MAX_IDLE, down to none.
        deadline = time.monotonic() + 20
        while server_connections() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert server_connections() == 0
    finally:
        stop(proc)


def test_a_celery_worker_drops_the_web_pool_and_keeps_its_own_connection(settings: Any) -> None:
    """What worker_process_init does in a worker: the pool option goes, the age comes."""
    from rftweb.celery import _keep_database_connections

    database = settings.DATABASES["default"]
    saved = (dict(database.get("OPTIONS", {})), database["CONN_MAX_AGE"])
    database["OPTIONS"] = {**saved[0], "pool": {"min_size": 0, "max_size": 3}}
    try:
        _keep_database_connections()
        assert "pool" not in database["OPTIONS"]
        assert database["CONN_MAX_AGE"] == settings.RFT_WORKER_CONN_MAX_AGE > 0
        assert connection.pool is None  # type: ignore[attr-defined]
    finally:
        connection.close()
        database["OPTIONS"], database["CONN_MAX_AGE"] = saved


def _workers(proc: Any) -> set[int]:
    """The pids of the uvicorn supervisor's worker processes (multiprocessing's spawned children)."""
    import psutil

    return {c.pid for c in psutil.Process(proc.pid).children(recursive=True) if "spawn_main" in " ".join(c.cmdline())}


def test_a_web_worker_stalled_longer_than_uvicorns_default_ping_keeps_its_requests(tmp_path: Path) -> None:
    """On a starved host a worker can go seconds without running. uvicorn's supervisor kills a
    worker that misses its 5 s ping by default, and every request and websocket it holds with
    it (bench/web_load saw it 5 times in 5 minutes). As docker-compose.yml runs the web tier, a
    worker stopped for 8 s and then let go answers the request that waited on it, and is the
    same process."""
    import contextlib
    import os
    import signal

    proc, url = start_uvicorn(log=tmp_path / "server.log", workers=2)  # one worker runs unsupervised
    try:
        before = _workers(proc)
        assert len(before) == 2
        for worker in before:
            os.kill(worker, signal.SIGSTOP)
        answer: list[Any] = []

        def ask() -> None:
            with contextlib.suppress(httpx.HTTPError):  # a reset: no answer, asserted below
                answer.append(httpx.get(f"{url}/health/", timeout=60))

        asker = threading.Thread(target=ask)
        try:
            asker.start()
            time.sleep(8)
        finally:
            for worker in before:
                with contextlib.suppress(ProcessLookupError):  # killed by the supervisor: asserted below
                    os.kill(worker, signal.SIGCONT)
        asker.join(timeout=60)
        assert _workers(proc) == before
        assert answer and answer[0].status_code == 200
    finally:
        stop(proc)
