"""The one place tests start processes: the environment a child process needs to share the
test database and Redis, a live server (HTTP + websockets + static files), real Celery
workers per queue, and one headless chromium.

Loaded for every test as a pytest plugin (the root conftest.py), so its fixtures are
available everywhere; the helpers are imported from here by the tests that drive processes
themselves (kill -9, CLI subprocesses)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


# ---------------------------------------------------------------- the environment of children

def database_url() -> str:
    """The URL of the database this test session uses (pytest-django's test database)."""
    from django.db import connection

    db = connection.settings_dict
    user = f"{db['USER']}@" if db.get("USER") else ""
    return f"postgres://{user}{db.get('HOST') or 'localhost'}:{db.get('PORT') or 5432}/{db['NAME']}"


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a child process (server, worker, CLI) that must see what the test
    sees: the test database (so tests using it need committed rows: transactional_db) and
    this checkout's Redis database. `extra` overrides any of it."""
    from django.conf import settings

    env = dict(os.environ)
    env.pop("TEST_DATABASE_NAME", None)
    env.update({
        "DATABASE_URL": database_url(),
        "REDIS_URL": settings.REDIS_URL,
        "DJANGO_SETTINGS_MODULE": "rftweb.settings",
        "PYTHONPATH": str(ROOT),
        "PYTHONUNBUFFERED": "1",
    })
    # One thread per process keeps a 2-core machine's step times stable (STACK-NOTES.md).
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(extra)
    return env


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def stop(proc: subprocess.Popen[Any], *, timeout: float = 20) -> None:
    """SIGTERM, then SIGKILL if it has not exited within `timeout` (its group, if it leads one)."""
    if proc.poll() is not None:
        return
    group = _leads_group(proc)
    (os.killpg(proc.pid, signal.SIGTERM) if group else proc.terminate())
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        (os.killpg(proc.pid, signal.SIGKILL) if group else proc.kill())
        proc.wait(timeout=10)


def _leads_group(proc: subprocess.Popen[Any]) -> bool:
    try:
        return os.getpgid(proc.pid) == proc.pid
    except ProcessLookupError:
        return False


def _tail(path: Path | None) -> str:
    return path.read_text(errors="replace")[-3000:] if path and path.exists() else ""


# ---------------------------------------------------------------------------- a live server

def start_server(*, log: Path, **env: str) -> tuple[subprocess.Popen[bytes], str]:
    """`manage.py runserver` (daphne's: HTTP and websockets, and static files as in DEBUG)
    on a free port; returns once /health/ answers."""
    import httpx

    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "runserver", f"127.0.0.1:{port}", "--noreload", "--skip-checks"],
        cwd=ROOT, env=child_env(**{"DEBUG": "1", **env}), stdout=log.open("wb"), stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the test server exited with {proc.returncode}: {_tail(log)}")
        try:
            if httpx.get(f"{url}/health/", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    stop(proc)
    raise RuntimeError(f"the test server did not answer within 60 s: {_tail(log)}")


@pytest.fixture(scope="session")
def live_url(django_db_setup: None, django_db_blocker: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real server for the session on the test database and the Redis channel layer."""
    from django.conf import settings

    if not settings.REDIS_URL:
        pytest.skip("the live-server tests need Redis for the channel layer (set REDIS_URL)")
    with django_db_blocker.unblock():
        proc, url = start_server(log=tmp_path_factory.mktemp("server") / "server.log")
    try:
        yield url
    finally:
        stop(proc)


# --------------------------------------------------------------------------- Celery workers

def _worker_command(queues: str, node: str, includes: tuple[str, ...], heartbeat: bool,
                    beat_schedule: Path | None) -> list[str]:
    cmd = [sys.executable, "-m", "celery", "-A", "rftweb", "worker", "-P", "solo", "-Q", queues,
           "-n", node, "--without-gossip", "--without-mingle", "-l", "INFO"]
    if not heartbeat:
        cmd.append("--without-heartbeat")
    if beat_schedule is not None:
        # Celery beat in the worker (`-B`): the periodic tasks, the RFT core's loop among them.
        cmd += ["-B", "-s", str(beat_schedule)]
    for module in includes:
        cmd += ["-I", module]
    return cmd


def worker_start(queues: str, *, name: str, log: Path | None = None, includes: tuple[str, ...] = (),
                 purge: bool = True, heartbeat: bool = True, beat: bool = False,
                 env: dict[str, str] | None = None, ready_seconds: float = 300) -> subprocess.Popen[bytes]:
    """Start `celery worker -P solo -Q queues` in its own process group (so a kill reaches
    the beat process `beat=True` forks too) and wait until it answers a ping. `purge` drops
    messages left by an earlier test first (so start the worker that must not lose queued
    work last, or pass purge=False). A trainer imports torch and TRL before it answers (a
    minute or two on a loaded 2-core host), hence the long wait."""
    from rftweb.celery import app

    if purge:
        app.control.purge()
    node = f"{name}-{os.getpid()}@{socket.gethostname()}"
    if log:
        log.parent.mkdir(parents=True, exist_ok=True)
    out: IO[bytes] | int = log.open("ab") if log else subprocess.DEVNULL
    proc = subprocess.Popen(
        _worker_command(queues, node, includes, heartbeat,
                        Path(tempfile.mkdtemp(prefix="rft-beat-")) / "schedule" if beat else None), cwd=ROOT, env=env or child_env(),
        stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
    )
    deadline = time.monotonic() + ready_seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"celery worker {name} exited with {proc.returncode}: {_tail(log)}")
        if app.control.ping(destination=[node], timeout=0.5):
            return proc
    stop(proc)
    raise RuntimeError(f"celery worker {name} did not answer a ping within {ready_seconds:.0f} s: {_tail(log)}")


@contextmanager
def celery_worker(queues: str, *, name: str = "test", log: Path | None = None, includes: tuple[str, ...] = (),
                  purge: bool = True, beat: bool = False, **env: str) -> Iterator[subprocess.Popen[bytes]]:
    """A real Celery worker for `queues` for the length of the block (with Celery beat in
    it when `beat`)."""
    proc = worker_start(queues, name=name, log=log, includes=includes, purge=purge, beat=beat, env=child_env(**env))
    try:
        yield proc
    finally:
        stop(proc)


class Workers:
    """Named Celery workers that tests start, stop and kill -9 as they need."""

    def __init__(self, logs: Path, **env: str) -> None:
        self.logs = logs
        self.env = child_env(**env)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, queues: str, *includes: str, beat: bool = False) -> None:
        self.procs[name] = worker_start(queues, name=name, log=self.logs / f"{name}.log", includes=includes,
                                        purge=False, heartbeat=False, beat=beat, env=self.env)

    def kill_all(self) -> None:
        """SIGKILL: no graceful shutdown, no message handed back, leases left behind."""
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
        self.procs.clear()

    def stop_all(self) -> None:
        for proc in self.procs.values():
            stop(proc)
        self.procs.clear()

    def log(self, name: str) -> str:
        path = self.logs / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""


@contextmanager
def rollout_stack(*, logs: Path, name: str) -> Iterator[str]:
    """A live server and a real Celery worker on the `rollout` queue for the block; yields
    the server's URL. The server waits long for a rollout (300 s): a test that means a
    failure to come back at once must not pass by timing out."""
    with celery_worker("rollout", name=name, log=logs / "worker.log", includes=("workers.explorer",)):
        server, url = start_server(log=logs / "server.log", RFT_ROLLOUT_TIMEOUT_SECONDS="300")
        try:
            yield url
        finally:
            stop(server)


def redis_flush() -> None:
    """Empty this checkout's Redis database (queues, markers, channel-layer leftovers)."""
    import redis
    from django.conf import settings

    redis.Redis.from_url(settings.REDIS_URL).flushdb()


# ------------------------------------------------------------------------------ the browser

# Module scope: Playwright's sync API keeps an event loop running on the test thread while
# it is open, which would stop later async tests and async_to_sync from working.
@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not Path(CHROMIUM).exists() and not shutil.which("chromium"):
        pytest.skip("Debian's chromium is not installed (make browser)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser: Any, live_url: str) -> Iterator[Any]:
    context = browser.new_context(base_url=live_url)
    pg = context.new_page()
    pg.set_default_timeout(15_000)
    yield pg
    context.close()


def login(page: Any, live_url: str, username: str, password: str = "pw-for-tests-only", next_path: str = "/") -> None:
    page.goto(f"{live_url}/login/?next={next_path}")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("button[type=submit]")
    page.wait_for_load_state()
