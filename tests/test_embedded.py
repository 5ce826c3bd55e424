"""The embedded default (no DATABASE_URL, no REDIS_URL): the buffer's single-worker
behaviour holds on SQLite too. Runs the portable tests in a child pytest on SQLite."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_the_portable_buffer_tests_pass_on_the_embedded_sqlite_default(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL", "TEST_DATABASE_NAME"}}
    env.update(RFT_TEST_EMBEDDED="1", RFT_VAR_DIR=str(tmp_path), SQLITE_PATH=str(tmp_path / "db.sqlite3"))
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "portable", "tests/buffer",
         "tests/test_settings.py::test_the_embedded_default_uses_sqlite_and_in_process_services"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and "failed" not in proc.stdout
