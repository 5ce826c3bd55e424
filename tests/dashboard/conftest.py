"""Fixtures of the dashboard tests: the environment of subprocesses (servers, workers, CLI)
pointed at the test database, and a daphne server for the page tests."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from django.conf import settings

ROOT = Path(__file__).resolve().parents[2]


def subprocess_env(**extra: str) -> dict[str, str]:
    """The environment of a child process that must see what the tests write: the test
    database (committed rows, so tests using it need transactional_db) and our Redis."""
    db = settings.DATABASES["default"]
    env = dict(os.environ)
    env.pop("TEST_DATABASE_NAME", None)
    env.update({
        "DATABASE_URL": f"postgres://{db.get('USER') or ''}@{db.get('HOST') or 'localhost'}:{db.get('PORT') or 5432}/{db['NAME']}",
        "REDIS_URL": settings.REDIS_URL,
        "DJANGO_SETTINGS_MODULE": "rftweb.settings",
        "OMP_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
        "DEBUG": "1",
    })
    env.update(extra)
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def live_daphne(django_db_setup: None, django_db_blocker: object, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real ASGI server (HTTP + websockets) on a free port, sharing the test database and
    the Redis channel layer with the test process."""
    if not settings.REDIS_URL:
        pytest.skip("the page tests need Redis for the channel layer (set REDIS_URL)")
    port = free_port()
    log = (tmp_path_factory.mktemp("daphne") / "daphne.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "rftweb.asgi:application"],
        cwd=ROOT, env=subprocess_env(), stdout=log, stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"daphne exited with {proc.returncode}; see {log.name}")
        try:
            if httpx.get(f"{url}/health/", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            proc.terminate()
            raise RuntimeError(f"daphne did not answer within 30 s; see {log.name}")
        time.sleep(0.2)
    yield url
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()


CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


# Module scope: Playwright's sync API keeps an event loop running on the test thread while
# it is open, which would stop later async tests and async_to_sync from working.
@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    if not Path("/usr/bin/chromium").exists():
        pytest.skip("Debian's chromium is not installed (make browser)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        yield b
        b.close()
