"""`make run`'s path: the embedded default (SQLite, in-process broker and channel layer)
serves the whole loop from one process, and a started demo run explores, trains and
publishes versions."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from bench.common import health_wait
from tests.servers import free_port

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_the_embedded_default_runs_the_demo_loop_in_one_process(tmp_path: Path, demo_model_dir: Path) -> None:
    # The same cached build the worker tests use: rft_demo finds it up to date.
    model_dir = demo_model_dir
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL", "TEST_DATABASE_NAME"}}
    # The wait windows end on a beat (10 s by default): at 1 s a step no longer waits up to 10 s
    # for the sweep after its 2 s window (about 20 of the test's seconds).
    env.update(RFT_VAR_DIR=str(tmp_path), RFT_DEMO_MODEL_DIR=str(model_dir), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
               RFT_FEEDBACK_EXPIRE_SECONDS="1")

    def manage(*args: str) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        return proc

    manage("migrate", "--noinput", "-v", "0")
    # The demo's people-in-the-loop policy (blend) with a short wait, since nobody rates here.
    demo = manage("rft_demo", "--total-steps", "4", "--feedback-wait", "2").stdout
    assert "demo ready" in demo and "/annotate/ as annotator" in demo
    port = free_port()
    log = (tmp_path / "serve.log").open("wb")
    server = subprocess.Popen(
        [sys.executable, "manage.py", "rft_serve", "--port", str(port)], cwd=ROOT, env=env,
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    db = sqlite3.connect(tmp_path / "rftweb.sqlite3")
    try:
        if not health_wait(f"http://127.0.0.1:{port}", seconds=60, poll=0.5):
            pytest.fail((tmp_path / "serve.log").read_text()[-3000:])
        assert httpx.get(f"http://127.0.0.1:{port}/login/").status_code == 200
        (run_id,) = db.execute("SELECT id FROM runs_run").fetchone()
        # The CLI is another process: its start reaches the server's conductor through the
        # database (the resume beat), as a start after a restart would.
        assert "is running" in manage("rft", "start", str(run_id)).stdout
        deadline = time.monotonic() + 240
        status = None
        while time.monotonic() < deadline:
            status, version, trained = db.execute(
                "SELECT status, current_version, train_step FROM runs_run WHERE id = ?", (run_id,)
            ).fetchone()
            if status != "running":
                break
            time.sleep(1)
        assert (status, version, trained) == ("finished", 4, 4), (tmp_path / "serve.log").read_text()[-3000:]
        (experiences,) = db.execute("SELECT count(*) FROM buffer_experience WHERE run_id = ?", (run_id,)).fetchone()
        (consumed,) = db.execute(
            "SELECT count(*) FROM buffer_experience WHERE run_id = ? AND status = 'consumed'", (run_id,)
        ).fetchone()
        assert experiences >= 4 * 64 and consumed == 4 * 64
    finally:
        db.close()
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        log.close()
