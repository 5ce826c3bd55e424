"""A real server for the page tests: daphne (through `manage.py runserver`, which also
serves static files) on a free port, on the test database and the Redis channel layer;
and one headless chromium for the session."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_env() -> dict[str, str]:
    """The environment of a process that shares the test database and channel layer."""
    from django.db import connection

    env = dict(os.environ)
    db = connection.settings_dict
    env["DATABASE_URL"] = f"postgres://{db.get('USER') or ''}@{db.get('HOST') or 'localhost'}:{db.get('PORT') or 5432}/{db['NAME']}"
    env.pop("TEST_DATABASE_NAME", None)
    env["DJANGO_SETTINGS_MODULE"] = "rftweb.settings"
    return env


@pytest.fixture(scope="session")
def live_url(django_db_setup: None, django_db_blocker: Any) -> Iterator[str]:
    port = _free_port()
    with django_db_blocker.unblock():
        env = server_env()
    log = open(ROOT / ".cache" / f"test-server-{port}.log", "w") if (ROOT / ".cache").is_dir() else subprocess.DEVNULL
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "runserver", f"127.0.0.1:{port}", "--noreload", "--skip-checks"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(url + "/health/", timeout=2)
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"the test server did not start (exit {proc.returncode})") from None
            time.sleep(0.2)
    yield url
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()


# Module scope: Playwright's sync API keeps an event loop on this thread while it runs,
# which would stop later tests' async_to_sync (event_publish) from working.
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
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context()
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


def worker_write(run_id: int, rows: list[dict[str, Any]] | None = None, event: dict[str, Any] | None = None,
                 events: list[dict[str, Any]] | None = None) -> list[int]:
    """Write experiences from another process, as a rollout worker does, and announce them
    (or only publish `event`, or `events` back to back)."""
    spec: dict[str, Any] = {"run_id": run_id, "rows": rows or []}
    if event is not None:
        spec["event"] = event
    if events is not None:
        spec["events"] = events
    result = subprocess.run(
        [sys.executable, "-m", "tests.feedback.worker", json.dumps(spec)],
        cwd=ROOT, env=server_env(), capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])["ids"]
