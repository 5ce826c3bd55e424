from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from django.test import Client

from apps.envapi.models import ApiKey
from apps.envapi.services import api_key_create
from apps.runs.models import Run
from tests.servers import start_server, stop

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
    # Django's cache names them `<prefix>:<version>:envapi:rate:…`.
    import redis

    client = redis.Redis.from_url(settings.REDIS_URL)
    for name in client.scan_iter("*:envapi:rate:*"):
        client.delete(name)


@pytest.fixture
def key(run: Run) -> tuple[ApiKey, str]:
    return make_key(run)


@pytest.fixture
def api(key: tuple[ApiKey, str]) -> Api:
    return Api(key[1])


# ---- a live server on the test database (tests/servers.py) ----------------------------

@pytest.fixture(scope="session")
def live_url(django_db_setup: None, django_db_blocker: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    # A short rollout wait: no rollout worker runs beside this server.
    with django_db_blocker.unblock():
        proc, url = start_server(log=tmp_path_factory.mktemp("live") / "server.log", RFT_ROLLOUT_TIMEOUT_SECONDS="0.3")
    try:
        yield url
    finally:
        stop(proc)
