"""Fixtures of the learning test: the demo model, shared with tests/workers through the same
cache directory (built once by its manifest), and the explorer / trainer / conductor as
real Celery workers."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("RFT_TEST_CACHE", ROOT / ".cache"))


@pytest.fixture(scope="session")
def demo_model_dir() -> Path:
    """The real demo model (`rft_demo_model` defaults); same cache as tests/workers."""
    from workers.demo_model import demo_model_build

    return demo_model_build(out=CACHE / "test-demo-model", progress=False, log=lambda _: None).out


@pytest.fixture
def loop_workers(transactional_db: Any, tmp_path: Path) -> Iterator[dict[str, Path]]:
    """Conductor (default), explorer (rollout) and trainer (train) as `celery worker -P solo`
    subprocesses on the test database and Redis; yields their log files."""
    from tests.servers import celery_worker, redis_flush

    redis_flush()
    env = {"RFT_STORAGE_DIR": str(tmp_path / "storage"), "RFT_CONDUCT_SECONDS": "0.3"}
    logs = {name: tmp_path / f"{name}.log" for name in ("conductor", "explorer", "trainer")}
    with ExitStack() as stack:
        stack.enter_context(celery_worker("train", name="learn-trainer", log=logs["trainer"], **env))
        stack.enter_context(celery_worker("rollout", name="learn-explorer", log=logs["explorer"], **env))
        # Last: the conductor's start purges no one else's messages (celery_worker purges first).
        stack.enter_context(celery_worker("default", name="learn-conductor", log=logs["conductor"], beat=True, **env))
        yield logs
    redis_flush()
