from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User

from apps.runs.models import Run
from tests.factories import add_member, make_run, make_taskset, make_user
from tests.databases import database_from_template, flush_by_delete_install, migrate_into, template_wanted

_ROOT = Path(__file__).resolve().parents[1]


def _persona(name: str) -> object:
    """A fixture `name`: the user of that name (the personas of the tests' sentences)."""

    @pytest.fixture(name=name)
    def person(db: None) -> User:
        return make_user(name)

    return person


# Owner, annotator and outsider of the shared `run`; Olga (an owner) and Anna (an annotator)
# in the tests that tell their story by name.
owner, annotator, outsider, olga, anna = map(_persona, ("owner", "annotator", "outsider", "olga", "anna"))


@pytest.fixture
def run(owner: User, annotator: User) -> Run:
    taskset = make_taskset(owner=owner)
    run = make_run(owner=owner, taskset=taskset)
    add_member(run, annotator)
    return run


def pytest_configure(config: pytest.Config) -> None:
    # Transactional tests' flush by DELETE (tests/databases.py); RFT_TEST_FLUSH_DELETE=0: TRUNCATE.
    if os.environ.get("RFT_TEST_FLUSH_DELETE", "1") != "0":
        flush_by_delete_install()


@pytest.fixture(scope="session")
def django_db_keepdb(request: pytest.FixtureRequest) -> bool:
    """Kept (pytest-django's --reuse-db path) where the test database is a fresh copy of the
    migrated template (tests/databases.py): Django then only checks that nothing is left
    to migrate; the copy is made again at the next session's start."""
    return template_wanted() or bool(request.config.getvalue("reuse_db"))


@pytest.fixture(scope="session")
def django_db_modify_db_settings(django_db_modify_db_settings: None, django_db_blocker: Any,
                                 request: pytest.FixtureRequest) -> None:
    """The test database (xdist's suffix applied by now), a copy of the template migrated once
    for the migrations as they are (tests/databases.py); each bench's own database is a copy too."""
    from django.db import connection

    if not template_wanted() or connection.vendor != "postgresql":
        return
    name = connection.settings_dict["TEST"].get("NAME") or f"test_{connection.settings_dict['NAME']}"
    worker = getattr(request.config, "workerinput", {}).get("workerid")
    base = name.removesuffix(f"_{worker}") if worker else name
    with django_db_blocker.unblock():
        template = database_from_template(settings_dict=connection.settings_dict, base=base,
                                          names=[name], migrate=migrate_into)
    # The benches' own and scratch databases (bench/common.py) are copies of it too.
    os.environ["BENCH_DATABASE_TEMPLATE"] = template


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup: None, django_db_blocker: Any) -> Iterator[None]:
    yield
    # Threads of async tests and killed child processes can leave sessions open on the test
    # database, which would stop Django from dropping it at the end.
    with django_db_blocker.unblock():
        from django.db import connection

        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )


@pytest.fixture(autouse=True)
def fresh_channel_layer() -> object:
    # Each async test runs on its own event loop, and a Redis channel layer holds locks and
    # connections bound to the loop it first ran on: a cached one can hang a later test.
    from channels.layers import channel_layers

    channel_layers.backends.clear()
    yield
    channel_layers.backends.clear()


async def run_socket_connect(run: Run, user: object) -> tuple[Any, bool]:
    """A websocket client of the run's live stream (the consumer alone, no server), as `user`."""
    from channels.testing import WebsocketCommunicator

    from apps.runs.consumers import RunEventsConsumer

    comm = WebsocketCommunicator(RunEventsConsumer.as_asgi(), f"/ws/runs/{run.pk}/")
    comm.scope["user"] = user
    comm.scope["url_route"] = {"args": (), "kwargs": {"run_id": run.pk}}
    connected, _ = await comm.connect(timeout=30)  # a refusal answers at once; a busy host is no refusal
    return comm, connected


@pytest.fixture(scope="session")
def vision_model_dir() -> Any:
    """The tiny VLM (workers/models/vision_demo.py, default settings), built once per cache like the demo model."""
    import os
    from pathlib import Path

    from workers.models.vision_demo import vision_model_build

    cache = Path(os.environ.get("RFT_TEST_CACHE", _ROOT / ".cache"))
    with _cache_lock(cache / "test-vision-model"):
        return vision_model_build(out=cache / "test-vision-model", log=lambda _: None).out


@pytest.fixture(scope="session")
def demo_model_dir() -> Path:
    """The real demo model (`rft_demo_model`'s default settings), built once per cache
    (RFT_TEST_CACHE, else the checkout's .cache) and shared by every module that needs it."""
    from workers.models.demo import demo_model_build

    cache = Path(os.environ.get("RFT_TEST_CACHE", _ROOT / ".cache"))
    with _cache_lock(cache / "test-demo-model"):
        return demo_model_build(out=cache / "test-demo-model", progress=False, log=lambda _: None).out


@contextmanager
def _cache_lock(out: Path) -> Iterator[None]:
    """Hold `out`.lock: the other xdist worker (`make test` runs two) waits while one builds
    into the shared cache, then finds the build done."""
    import fcntl

    out.parent.mkdir(parents=True, exist_ok=True)
    with (out.parent / f"{out.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


@pytest.fixture
def bench(demo_model_dir: Path, db: None) -> Iterator[Callable[..., subprocess.CompletedProcess[str]]]:
    """`bench(NAME, *ARGS)` runs `python -m bench.NAME ARGS` (a smoke test of a bench) on a
    database of its own beside the test database (bench/common.py: `<test db>_bench_<name>_<pid>`,
    dropped when the bench ends), with the tests' demo model; returns the finished process."""
    from django.conf import settings as django_settings
    from django.db import connection

    settings = connection.settings_dict
    server = f"postgres://{settings.get('HOST') or 'localhost'}:{settings.get('PORT') or 5432}"
    env = {
        **os.environ,
        "BENCH_DATABASE_URL": f"{server}/{settings['NAME']}_bench",
        "PYTHONPATH": str(_ROOT),
        "BENCH_DEMO_DIR": str(demo_model_dir),
        # A Redis database of its own: a bench flushes its broker and starts workers that would
        # take the tests' leftover messages (whose run ids mean other runs in the bench's database).
        "REDIS_URL": _redis_beside(django_settings.REDIS_URL),
    }
    env.pop("TEST_DATABASE_NAME", None)
    env.pop("BENCH_OWN_DATABASE_URL", None)

    def run(name: str, *args: str, timeout: float = 1500) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", f"bench.{name}", *args], cwd=_ROOT, env=env, capture_output=True,
                              text=True, timeout=timeout)

    yield run
    # A bench killed by its timeout could not drop its database: whatever of this test
    # database's benches is left goes now (the name is this xdist worker's alone).
    import psycopg

    with psycopg.connect(f"{server}/postgres", autocommit=True) as admin:
        for (left,) in admin.execute("SELECT datname FROM pg_database WHERE datname LIKE %s",
                                     (settings["NAME"].replace("_", "\\_") + "\\_bench\\_%",)).fetchall():
            admin.execute(f'DROP DATABASE IF EXISTS "{left}" WITH (FORCE)')


def _redis_beside(url: str) -> str:
    """The same Redis server, database number + 2 (mod 16): xdist worker N's tests are on
    + 4 × N (rftweb/settings.py), its benches between them."""
    from rftweb.env import redis_database_moved

    return redis_database_moved(url or "redis://localhost:6379/0", 2)
