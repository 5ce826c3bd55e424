from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest
from django.test import Client

from apps.envapi.models import ApiKey
from apps.envapi.services import api_key_create
from apps.runs.models import Run

ALL = ("read", "submit", "feedback")


def make_key(*runs: Run, actions: Sequence[str] = ALL, rate: int = 10_000, name: str = "env") -> tuple[ApiKey, str]:
    return api_key_create(name=name, runs=runs, actions=list(actions), rate_limit_per_minute=rate)


class Api:
    """The Django test client speaking to /api/v1/ with a bearer key."""

    def __init__(self, raw: str | None) -> None:
        self.client = Client()
        self.raw = raw

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.raw}"} if self.raw else {}

    def get(self, path: str, **params: Any) -> Any:
        return self.client.get(f"/api/v1{path}", params, headers=self._headers())

    def post(self, path: str, body: Any = None, *, raw: bytes | None = None) -> Any:
        data = raw if raw is not None else json.dumps(body)
        return self.client.post(f"/api/v1{path}", data=data, content_type="application/json", headers=self._headers())


@pytest.fixture(autouse=True)
def _fast_passwords(settings: Any) -> None:
    # The personas' passwords are hashed for every test; the real hasher is built to be slow.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def _fresh_rate_windows(settings: Any) -> None:
    # Rate windows live in Redis under the key's id, and ids restart with each test database.
    import redis

    client = redis.Redis.from_url(settings.REDIS_URL)
    for name in client.scan_iter("rftweb:envapi:rate:*"):
        client.delete(name)


@pytest.fixture
def key(run: Run) -> tuple[ApiKey, str]:
    return make_key(run)


@pytest.fixture
def api(key: tuple[ApiKey, str]) -> Api:
    return Api(key[1])


# ---- a live ASGI server on the test database (daphne, as in production) ---------------

import os  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def server_env(**extra: str) -> dict[str, str]:
    """The environment of a subprocess that must use this test session's database."""
    from django.db import connection

    db = connection.settings_dict
    env = dict(os.environ)
    env.pop("TEST_DATABASE_NAME", None)
    env.update(
        DATABASE_URL=f"postgres://{db.get('HOST') or 'localhost'}:{db.get('PORT') or 5432}/{db['NAME']}",
        DJANGO_SETTINGS_MODULE="rftweb.settings",
        PYTHONUNBUFFERED="1",
        LOG_LEVEL="WARNING",
    )
    env.update(extra)
    return env


def start_server(*, log: Path, **extra: str) -> tuple[subprocess.Popen[bytes], str]:
    import httpx

    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "rftweb.asgi:application"],
        cwd=ROOT, env=server_env(**extra), stdout=log.open("wb"), stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited: {log.read_text()[-2000:]}")
        try:
            if httpx.get(f"{url}/health/", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.terminate()
    raise RuntimeError(f"the server did not start: {log.read_text()[-2000:]}")


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="session")
def live_url(django_db_setup: None, django_db_blocker: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    # A short rollout wait: no rollout worker runs beside this server.
    proc, url = start_server(log=tmp_path_factory.mktemp("live") / "daphne.log", RFT_ROLLOUT_TIMEOUT_SECONDS="0.3")
    try:
        yield url
    finally:
        stop(proc)
