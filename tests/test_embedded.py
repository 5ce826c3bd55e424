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


@pytest.mark.slow
def test_rft_serve_stops_promptly_on_sigterm(tmp_path: Path) -> None:
    """A process manager's SIGTERM (or Ctrl+C) ends the embedded server within
    RFT_SERVE_STOP_SECONDS and a little: Celery's warm shutdown alone took 7-17 s."""
    import signal
    import time

    import httpx

    from tests.servers import free_port

    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL", "TEST_DATABASE_NAME"}}
    env.update(RFT_VAR_DIR=str(tmp_path), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", RFT_SERVE_STOP_SECONDS="1")
    subprocess.run([sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=ROOT, env=env, check=True,
                   timeout=300)
    port = free_port()
    log = tmp_path / "serve.log"
    server = subprocess.Popen([sys.executable, "manage.py", "rft_serve", "--port", str(port)], cwd=ROOT, env=env,
                              stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and " ready." not in log.read_text(errors="replace"):
            assert server.poll() is None, log.read_text()[-3000:]
            time.sleep(0.5)
        assert httpx.get(f"http://127.0.0.1:{port}/health/", timeout=5).status_code == 200
        sent = time.monotonic()
        server.send_signal(signal.SIGTERM)
        code = server.wait(timeout=30)
        took = time.monotonic() - sent
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
    assert code == 0, log.read_text()[-3000:]
    # The grace (1 s) plus the exit itself on a loaded 2-core host.
    assert took < 6, f"{took:.1f} s: {log.read_text()[-2000:]}"
