"""Fast truth during outages (issue 49): with Postgres stopped, the first request that needs it
is answered 503 in about a second, not after the pool's 30 s wait; the login form and
/health/ (liveness, no database) keep serving; service is back within a couple of seconds
of Postgres's return and the next requests do not hang. A websocket opened while Redis is
down is closed with 1013 (try again), never a 500. Throwaway services on spare ports
(tests/servers.py), under uvicorn as docker-compose.yml runs it; the pool keeps its default
30 s wait (RFT_DB_POOL_TIMEOUT) for a busy pool."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
from django.conf import settings
from django.contrib.auth.models import User
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from tests.factories import make_run
from tests.servers import Postgres, Redis, start_uvicorn, stop
from tests.test_degrade import session_cookie, spare_postgres, spare_redis  # noqa: F401  (fixtures)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

COOKIE = {"Cookie": f"{settings.SESSION_COOKIE_NAME}=abcdefghijklmnopqrstuvwxyz012345"}


def timed(http: httpx.Client, path: str, **kwargs: object) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    answer = http.get(path, **kwargs)  # type: ignore[arg-type]
    return answer, time.monotonic() - started


def test_postgres_stopped_is_answered_in_a_second_from_the_first_request_and_back_in_two(
        tmp_path: Path, spare_postgres: Postgres) -> None:  # noqa: F811
    proc, url = start_uvicorn(log=tmp_path / "web.log", DATABASE_URL=spare_postgres.url)
    try:
        with httpx.Client(base_url=url, timeout=60) as http:
            assert http.get("/ready/").json()["database"] == "ok"
            spare_postgres.stop()

            first, took = timed(http, "/runs/", headers=COOKIE)
            assert first.status_code == 503 and "Postgres is unreachable" in first.text, first.text[-300:]
            assert took < 3, f"the first request waited {took:.1f} s"
            for path, headers in (("/runs/1/", COOKIE), ("/api/v1/runs", {"Authorization": "Bearer rft_abc_def"})):
                answer, took = timed(http, path, headers=headers)
                assert answer.status_code == 503 and answer.headers["Retry-After"] == "10", (path, answer.text[-300:])
                assert took < 2, f"{path} waited {took:.1f} s"
            # What needs no database keeps serving.
            login, took = timed(http, "/login/")
            assert login.status_code == 200 and 'name="password"' in login.text and took < 2
            assert http.get("/health/").status_code == 200
            ready = http.get("/ready/")
            assert ready.status_code == 503 and ready.json()["down"] == ["Postgres"]

            spare_postgres.start()
            back_at = time.monotonic()
            while http.get("/ready/").status_code != 200:
                assert time.monotonic() - back_at < 4, (tmp_path / "web.log").read_text()[-4000:]
            for _ in range(5):  # and nothing after it hangs on a retry the pool scheduled
                answer, took = timed(http, "/ready/")
                assert answer.status_code == 200 and took < 2, took
    finally:
        stop(proc)


def test_a_websocket_opened_while_redis_is_down_is_told_to_try_again(
        tmp_path: Path, spare_redis: Redis, owner: User) -> None:  # noqa: F811
    run = make_run(owner=owner)
    proc, url = start_uvicorn(log=tmp_path / "web.log", REDIS_URL=spare_redis.url, DEBUG="1",
                              SECRET_KEY=settings.SECRET_KEY)
    try:
        spare_redis.stop()
        ws_url = url.replace("http", "ws") + f"/ws/runs/{run.pk}/"
        with connect(ws_url, additional_headers={"Origin": url, "Cookie": session_cookie(owner)},
                     open_timeout=30) as ws:
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv(timeout=30)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1013
    finally:
        stop(proc)
    log = (tmp_path / "web.log").read_text()
    assert "Traceback" not in log and " 500" not in log, log[-3000:]


def test_a_websocket_opened_while_postgres_is_down_is_told_to_try_again(
        tmp_path: Path, spare_postgres: Postgres) -> None:  # noqa: F811
    """Channels' auth middleware looks the session up before any consumer runs: with Postgres
    gone that raised out of the application, and the server answered the handshake 500."""
    proc, url = start_uvicorn(log=tmp_path / "web.log", DATABASE_URL=spare_postgres.url)
    try:
        with httpx.Client(base_url=url, timeout=30) as http:
            assert http.get("/ready/").json()["database"] == "ok"
        spare_postgres.stop()
        ws_url = url.replace("http", "ws") + "/ws/runs/1/"
        for attempt in range(2):  # the first finds the outage out, the second is refused at once
            started = time.monotonic()
            with connect(ws_url, additional_headers={"Origin": url, **COOKIE}, open_timeout=30) as ws:
                with pytest.raises(ConnectionClosed) as closed:
                    ws.recv(timeout=30)
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1013, (attempt, closed.value)
            assert time.monotonic() - started < 4, f"attempt {attempt} took {time.monotonic() - started:.1f} s"
    finally:
        stop(proc)
    log = (tmp_path / "web.log").read_text()
    assert "Traceback" not in log and " 500" not in log, log[-3000:]
    assert log.count("refused for now: Postgres unreachable") == 2, log[-3000:]
