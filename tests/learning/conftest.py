"""Fixtures of the learning test: the explorer / trainer / conductor as real Celery workers
(the demo model and the `bench` runner are in tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest


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
