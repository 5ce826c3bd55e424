"""Fixtures of the learning test: the explorer / trainer / conductor as real Celery workers
(the demo model and the `bench` runner are in tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="package")
def loop_workers(django_db_setup: Any, django_db_blocker: Any,
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    """Conductor (default), explorer (rollout) and trainer (train) as `celery worker -P solo`
    subprocesses on the test database and Redis; yields their log files. Shared by the
    package's loop tests (the calculator agent and the GRPO loop; the tests between them make
    no committed running runs for the conductor to advance): starting and stopping the three
    cost 40-70 s a test on a loaded host. A run of one test leaves nothing another reads: the
    engines hold versions by path, the trainer its residents by run id."""
    from tests.servers import Workers, redis_flush

    tmp = tmp_path_factory.mktemp("loop-workers")
    with django_db_blocker.unblock():
        redis_flush()
        workers = Workers(tmp, heartbeat=True, RFT_STORAGE_DIR=str(tmp / "storage"), RFT_CONDUCT_SECONDS="0.3")
        try:
            workers.start_together(("trainer", "train", (), False), ("explorer", "rollout", (), False),
                                   ("conductor", "default", (), True))
            yield {name: tmp / f"{name}.log" for name in ("conductor", "explorer", "trainer")}
        finally:
            workers.stop_all()
            redis_flush()
