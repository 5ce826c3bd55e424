"""Fixtures of the learning test: the demo model, shared with tests/workers through the same
cache directory (built once by its manifest), and the explorer / trainer / conductor as
real Celery workers."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def bench(demo_model_dir: Path, db: None) -> Callable[..., subprocess.CompletedProcess[str]]:
    """`bench(NAME, *ARGS)` runs `python -m bench.NAME ARGS` (a smoke test of a bench) on a
    database beside the test database, with the tests' demo model; returns the finished process."""
    from django.db import connection

    settings = connection.settings_dict
    env = {
        **os.environ,
        "BENCH_DATABASE_URL": (f"postgres://{settings.get('HOST') or 'localhost'}:{settings.get('PORT') or 5432}/"
                               f"{settings['NAME']}_bench"),
        "PYTHONPATH": str(ROOT),
        "BENCH_DEMO_DIR": str(demo_model_dir),
    }
    env.pop("TEST_DATABASE_NAME", None)

    def run(name: str, *args: str, timeout: float = 1500) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", f"bench.{name}", *args], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=timeout)

    return run


@pytest.fixture
def loop_workers(transactional_db: Any, tmp_path: Path) -> Iterator[dict[str, Path]]:
    """Conductor (default), explorer (rollout) and trainer (train) as `celery worker -P solo`
    subprocesses on the test database and Redis; yields their log files."""
    from tests.servers import celery_worker, redis_flush

    redis_flush()
    storage = str(tmp_path / "storage")
    logs = {name: tmp_path / f"{name}.log" for name in ("conductor", "explorer", "trainer")}

    def worker(queues: str, name: str, log: Path, *, beat: bool = False) -> Any:
        return celery_worker(queues, name=name, log=log, beat=beat, RFT_STORAGE_DIR=storage, RFT_CONDUCT_SECONDS="0.3")

    with ExitStack() as stack:
        stack.enter_context(worker("train", "learn-trainer", logs["trainer"]))
        stack.enter_context(worker("rollout", "learn-explorer", logs["explorer"]))
        # Last: the conductor's start purges no one else's messages (celery_worker purges first).
        stack.enter_context(worker("default", "learn-conductor", logs["conductor"], beat=True))
        yield logs
    redis_flush()
