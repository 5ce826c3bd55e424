"""Degrade, don't fail (issue #33): a web process whose Redis or Postgres stops answering
keeps answering: pages render without the cache, the API answers 503 with Retry-After (its
rate limiter fails closed), /ready/ names the service that is down, and with Postgres gone
every request that needs it is a short 503 page, never a traceback. Each service is a
throwaway instance on a spare port (tests/test_faults.py's), stopped mid-test; the machine's
shared ones are never touched."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.test import Client

from tests.factories import add_member, make_experiences, make_run, make_taskset
from tests.envapi.conftest import make_key
from tests.servers import Postgres, Redis, as_postgres_user, start_uvicorn, stop

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def session_cookie(user: User) -> str:
    """A logged-in session of `user`, as the Cookie header a browser would send."""
    client = Client()
    client.force_login(user)
    return f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"


@pytest.fixture
def spare_redis() -> Iterator[Redis]:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    redis = Redis(Path(tempfile.mkdtemp(prefix="rft-degrade-redis-")))
    redis.start()
    try:
        yield redis
    finally:
        redis.stop()


def test_with_redis_stopped_pages_render_the_api_answers_503_and_ready_names_redis(
        tmp_path: Path, spare_redis: Redis, owner: User, annotator: User) -> None:
    # Raters weighted by agreement: the annotation queue reads each rater's cached standing.
    run = make_run(owner=owner, taskset=make_taskset(owner=owner), feedback={"rater_weighting": "agreement"})
    add_member(run, annotator)
    make_experiences(run)
    _, raw_key = make_key(run)
    # The test's secret, so the server takes the sessions this process logs in.
    proc, url = start_uvicorn(log=tmp_path / "web.log", REDIS_URL=spare_redis.url, DEBUG="1", SECRET_KEY=settings.SECRET_KEY)
    try:
        with httpx.Client(base_url=url, timeout=30) as http:
            bearer = {"Authorization": f"Bearer {raw_key}"}
            assert http.get("/ready/").json() == {"ok": True, "database": "ok", "redis": "ok"}
            assert http.get(f"/api/v1/runs/{run.pk}", headers=bearer).status_code == 200

            spare_redis.stop()

            # Pages render: the cache is read around (the annotation queue reads rater standings).
            assert http.get(f"/runs/{run.pk}/", headers={"Cookie": session_cookie(owner)}).status_code == 200
            annotate = http.get(f"/runs/{run.pk}/annotate/", headers={"Cookie": session_cookie(annotator)})
            assert annotate.status_code == 200, annotate.text[-2000:]
            # The API's rate limiter cannot count: it refuses, 503 with Retry-After, in the API's shape.
            refused = http.get(f"/api/v1/runs/{run.pk}", headers=bearer)
            assert refused.status_code == 503, refused.text
            assert int(refused.headers["Retry-After"]) > 0
            assert "Redis" in refused.json()["detail"]
            assert refused.json()["code"] == "unavailable"  # the API's stable code, in an outage too
            # The OpenAI door too, in its own shape.
            models = http.get(f"/api/v1/runs/{run.pk}/openai/v1/models", headers=bearer)
            assert models.status_code == 503 and "Retry-After" in models.headers, models.text
            # A load balancer stops sending traffic; liveness still holds.
            ready = http.get("/ready/")
            assert ready.status_code == 503
            assert ready.json()["down"] == ["Redis"] and ready.json()["database"] == "ok"
            assert http.get("/health/").status_code == 200
    finally:
        stop(proc)
    assert "Traceback" not in (tmp_path / "web.log").read_text()


@pytest.fixture
def spare_postgres() -> Iterator[Postgres]:
    base = Path(tempfile.mkdtemp(prefix="rft-degrade-pg-"))
    os.chmod(base, 0o755)
    pg = Postgres(base / "pg")
    pg.start()
    try:
        subprocess.run([*as_postgres_user(), str(pg.bin / "createdb"), "-h", "127.0.0.1", "-p", str(pg.port), "-U",
                        "postgres", "faults"], check=True, capture_output=True)
        yield pg
    finally:
        pg.stop()
        shutil.rmtree(base, ignore_errors=True)


def test_with_postgres_stopped_every_request_that_needs_it_answers_a_short_503(
        tmp_path: Path, spare_postgres: Postgres) -> None:
    # No schema is needed: with the database gone, no query gets that far.
    proc, url = start_uvicorn(log=tmp_path / "web.log", DATABASE_URL=spare_postgres.url, RFT_DB_POOL_TIMEOUT="2")
    try:
        with httpx.Client(base_url=url, timeout=30) as http:
            assert http.get("/ready/").status_code == 200

            spare_postgres.stop()

            cookie = {"Cookie": f"{settings.SESSION_COOKIE_NAME}=abcdefghijklmnopqrstuvwxyz012345"}
            for path in ("/runs/", "/runs/1/", "/admin/", "/accounts/"):
                page = http.get(path, headers=cookie)
                assert page.status_code == 503, (path, page.status_code, page.text[-500:])
                assert page.headers["Retry-After"] == "10" and "Postgres is unreachable" in page.text
                assert "Traceback" not in page.text and len(page.text) < 1000
            for path in ("/api/v1/runs", "/api/v1/runs/1/openai/v1/models"):
                answer = http.get(path, headers={"Authorization": "Bearer rft_abcdef_0123456789"})
                assert answer.status_code == 503, (path, answer.text[-500:])
                assert "Retry-After" in answer.headers and "Postgres" in answer.text
            ready = http.get("/ready/")
            assert ready.status_code == 503 and ready.json()["down"] == ["Postgres"]
    finally:
        stop(proc)


def test_once_a_process_has_seen_postgres_gone_it_answers_at_once_and_serves_again_when_it_is_back(
        tmp_path: Path, spare_postgres: Postgres) -> None:
    """The pool waits RFT_DB_POOL_TIMEOUT for a connection it cannot open; after the first
    request found Postgres gone, the next ones do not wait it again, and pages come back within
    a few seconds of Postgres without a restart of the web process."""
    proc, url = start_uvicorn(log=tmp_path / "web.log", DATABASE_URL=spare_postgres.url, RFT_DB_POOL_TIMEOUT="8")
    cookie = {"Cookie": f"{settings.SESSION_COOKIE_NAME}=abcdefghijklmnopqrstuvwxyz012345"}
    try:
        with httpx.Client(base_url=url, timeout=60) as http:
            assert http.get("/login/").status_code == 200
            spare_postgres.stop()
            assert http.get("/runs/", headers=cookie).status_code == 503  # found out (up to the pool's 8 s)
            for path in ("/runs/", "/runs/1/", "/login/", "/api/v1/runs"):
                started = time.monotonic()
                page = http.get(path, headers=cookie)
                took = time.monotonic() - started
                assert page.status_code == 503 and "Postgres" in page.text and page.headers["Retry-After"] == "10"
                assert took < 4, f"{path} waited {took:.1f} s while the outage was known"
            started = time.monotonic()
            ready = http.get("/ready/")
            assert ready.status_code == 503 and ready.json()["down"] == ["Postgres"]
            assert time.monotonic() - started < 4

            spare_postgres.start()
            deadline, back = time.monotonic() + 30, False
            while not back and time.monotonic() < deadline:
                # The login form alone is served during an outage too (it needs no database):
                # the process's own view of Postgres is the event (this spare server has no tables).
                back = http.get("/ready/").json().get("database") == "ok"
                time.sleep(0 if back else 0.5)
            assert back, "pages did not come back with Postgres"
            assert http.get("/ready/").json()["database"] == "ok"
    finally:
        stop(proc)


def test_the_api_answers_503_when_a_database_error_is_a_lost_connection_only(rf: Any) -> None:
    """Only an unreachable service is a 503: other errors still surface (they are bugs)."""
    from django.db import IntegrityError, OperationalError
    from redis.exceptions import ConnectionError as RedisConnectionError

    from rftweb.degrade import dependency_down

    assert dependency_down(OperationalError("connection refused")) == "Postgres"
    assert dependency_down(RedisConnectionError("Error 111 connecting")) == "Redis"
    try:
        try:
            raise RedisConnectionError("gone")
        except RedisConnectionError as exc:
            raise RuntimeError("wrapped") from exc
    except RuntimeError as wrapped:
        assert dependency_down(wrapped) == "Redis"
    assert dependency_down(IntegrityError("duplicate key")) is None
    assert dependency_down(ValueError("x")) is None


def test_cache_reads_fall_back_to_computing_when_the_caches_redis_is_unreachable(
        settings: Any, owner: User, annotator: User) -> None:
    from apps.feedback.raters.reliability import rater_standing
    from rftweb.degrade import cached
    from tests.servers import free_port

    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache",
                                   "LOCATION": f"redis://127.0.0.1:{free_port()}/0",
                                   "OPTIONS": {"socket_timeout": 1, "socket_connect_timeout": 1}}}
    # (Django drops its cache objects when CACHES changes: the next read connects to the dead port.)
    assert cached("answer", lambda: 42, 30) == 42
    run = make_run(owner=owner, taskset=make_taskset(owner=owner), feedback={"rater_weighting": "agreement"})
    assert rater_standing(run=run, annotator_id=annotator.pk) == "unmeasured"


def test_a_pool_with_every_connection_in_use_answers_503_busy_not_postgres_unreachable(tmp_path: Path) -> None:
    """A request that waits RFT_DB_POOL_TIMEOUT for a pooled connection while the pool's
    every connection is in use is told the server is busy (503, Retry-After); Postgres answers,
    so "Postgres is unreachable" would send an operator after the wrong thing."""
    import threading

    from django.db import connection, transaction

    proc, url = start_uvicorn(log=tmp_path / "web.log", RFT_DB_POOL_SIZE="1", RFT_DB_POOL_TIMEOUT="1")
    cookie = {"Cookie": f"{settings.SESSION_COOKIE_NAME}=abcdefghijklmnopqrstuvwxyz012345"}
    first: list[httpx.Response] = []
    try:
        with httpx.Client(base_url=url, timeout=30) as http:
            with transaction.atomic():
                with connection.cursor() as cur:
                    # The first request takes the pool's one connection and waits on this lock
                    # (its session lookup) until the block ends.
                    cur.execute("LOCK TABLE django_session IN ACCESS EXCLUSIVE MODE")
                holder = threading.Thread(target=lambda: first.append(http.get("/runs/", headers=cookie)))
                holder.start()
                # Until the first request holds the pool's connection, waiting on the lock (not
                # a guessed second: under load the request reached the server later).
                _lock_waited_on("django_session")
                page = http.get("/runs/", headers=cookie)
                answer = http.get("/api/v1/runs", headers={"Authorization": "Bearer rft_abcdef_0123456789"})
            holder.join(timeout=30)
        assert page.status_code == 503 and page.headers["Retry-After"] == "10", (page.status_code, page.text[-300:])
        assert "The server is busy: every database connection was in use for 1 s" in page.text
        assert "unreachable" not in page.text and "Traceback" not in page.text
        assert answer.status_code == 503 and "busy" in answer.json()["detail"], answer.text[-300:]
        # The request that held the connection was answered once the lock went: nothing was down.
        assert first and first[0].status_code == 302, first
    finally:
        stop(proc)


def _lock_waited_on(table: str, *, timeout: float = 60.0) -> None:
    """Until another session waits for a lock on `table` (this test's session holds it)."""
    from django.db import connection

    deadline = time.monotonic() + timeout
    while True:
        with connection.cursor() as cur:
            cur.execute("SELECT count(*) FROM pg_locks WHERE relation = %s::regclass AND NOT granted AND database = "
                        "(SELECT oid FROM pg_database WHERE datname = current_database())", [table])
            if cur.fetchone()[0]:
                return
        assert time.monotonic() < deadline, f"no request waited on {table}'s lock within {timeout:.0f} s"
        time.sleep(0.05)


def test_a_pool_timeout_is_busy_only_when_the_pool_is_full(settings: Any) -> None:
    """Without a full pool (none at all here) the pool's timeout means it could not open a
    connection: Postgres is named."""
    from django.db import OperationalError
    from psycopg_pool import PoolTimeout

    from rftweb.degrade import BUSY, dependency_down

    try:
        try:
            raise PoolTimeout("couldn't get a connection after 1.00 sec")
        except PoolTimeout as exc:
            raise OperationalError(str(exc)) from exc
    except OperationalError as wrapped:
        assert dependency_down(wrapped) == "Postgres" != BUSY


def test_an_outage_is_probed_by_one_request_per_interval_and_ends_when_a_probe_connects() -> None:
    from rftweb.degrade import Outage

    answers: list[bool] = []
    probes: list[float] = []

    def probe() -> bool:
        probes.append(time.monotonic())
        return answers.pop(0)

    # An interval of 1 s: two calls in a row never straddle it, even on a loaded host (at
    # 0.2 s a stall between them would probe again and find no answer queued).
    outage = Outage(probe, probe_seconds=1.0)
    assert not outage.holds() and not probes  # nothing seen: no probe, no short-cut
    outage.seen()
    assert all(outage.holds() for _ in range(50)) and not probes  # within the interval: no probe
    time.sleep(1.05)
    answers[:] = [False]
    assert outage.holds() and len(probes) == 1  # the probe failed: still out
    assert outage.holds() and len(probes) == 1  # and the next interval has begun
    time.sleep(1.05)
    answers[:] = [True]
    assert not outage.holds() and len(probes) == 2  # a probe connected: requests go through
    assert not outage.holds() and len(probes) == 2
