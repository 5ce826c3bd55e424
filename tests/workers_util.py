"""Real Celery workers for tests: a subprocess per worker, against the test database and
the test Redis, stopped (and its group killed) when the test ends."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from django.conf import settings
from django.db import connection

ROOT = Path(__file__).resolve().parent.parent


def test_env(**extra: str) -> dict[str, str]:
    """The environment a child process needs to see what the test sees."""
    db = connection.settings_dict
    env = dict(os.environ)
    env["DATABASE_URL"] = f"postgres://{db['USER'] or ''}@{db['HOST'] or 'localhost'}:{db['PORT'] or 5432}/{db['NAME']}"
    env["REDIS_URL"] = settings.REDIS_URL
    env.pop("TEST_DATABASE_NAME", None)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.update(extra)
    return env


@contextmanager
def celery_worker(queues: str, *, name: str = "test", log: Path | None = None, beat: bool = False,
                  **env: str) -> Iterator[subprocess.Popen[bytes]]:
    """Run `celery worker -P solo` for `queues` until the block ends; waits until it is ready.
    beat: it also runs Celery beat, the RFT core's loop among it (apps/runs/orchestration.py)."""
    from rftweb.celery import app

    # Leftover messages from an earlier test must not reach this worker.
    app.control.purge()
    out = open(log, "wb") if log else subprocess.DEVNULL
    with_beat: list[str] = []
    if beat:
        with_beat = ["-B", "-s", str(Path(tempfile.mkdtemp(prefix="rft-beat-")) / "schedule")]
    proc = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "rftweb", "worker", "-P", "solo", "-Q", queues,
         "-n", f"{name}-{os.getpid()}@%h", "--without-gossip", "--without-mingle", "-l", "info", *with_beat],
        cwd=ROOT, env=test_env(**env), stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
    )
    try:
        # A trainer imports torch and TRL before it answers (a minute on a loaded host).
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"celery worker exited with {proc.returncode}")
            replies = app.control.ping(destination=[f"{name}-{os.getpid()}@{os.uname().nodename}"], timeout=0.5)
            if replies:
                break
        else:
            raise RuntimeError("celery worker did not answer a ping within 300 s")
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if log:
            out.close()
