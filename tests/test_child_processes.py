"""Servers and workers die with the test process that started them, even when it is killed
with SIGKILL and no fixture teardown runs (a killed `make test` once left Celery workers
holding the test database, and the next run errored on every database test).

An inner pytest starts a real Celery worker with beat in it (two processes: the worker and
the beat process it forks) through tests/servers.py, says which process group they are in,
and waits; the outer test SIGKILLs that pytest and watches the group empty."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.servers import ROOT, child_env

pytestmark = pytest.mark.slow

INNER = '''
import time
from pathlib import Path

from tests.servers import celery_worker


def test_a_worker_that_outlives_nothing() -> None:
    with celery_worker("default", name="orphan-check", beat=True, log=Path({log!r})) as proc:
        Path({group!r}).write_text(str(proc.pid))
        time.sleep(600)
'''


def _group_members(pgid: int, running: str = "") -> list[int]:
    """The pids of the live processes in process group `pgid` (from /proc) whose command
    line holds `running`."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid pgrp …: comm may hold spaces, so split after its ')'.
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[2]) == pgid and fields[0] != "Z" and running in (entry / "cmdline").read_bytes().decode(errors="replace"):
            members.append(int(entry.name))
    return members


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process groups from /proc (Linux)")
def test_a_killed_pytest_takes_its_workers_with_it(tmp_path: Path) -> None:
    group_file, log = tmp_path / "group", tmp_path / "worker.log"
    (tmp_path / "test_inner.py").write_text(INNER.format(group=str(group_file), log=str(log)))
    # The inner session runs no database test: the worker gets a database name that does not
    # exist, so nothing it does (its heartbeat) touches ours.
    env = child_env(DATABASE_URL="postgres://localhost:5432/rft_orphan_check_no_such_db")
    env.pop("DJANGO_SETTINGS_MODULE")  # pytest-django reads the inner session's own flag below
    inner = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--ds=rftweb.settings", "-o",
         f"pythonpath={ROOT}", str(tmp_path / "test_inner.py")],
        cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 300
        while not group_file.exists():
            assert inner.poll() is None, f"the inner pytest ended early ({inner.returncode})"
            assert time.monotonic() < deadline, "the inner pytest's worker did not come up"
            time.sleep(0.5)
        pgid = int(group_file.read_text())
        # The worker and the beat process it forked (beat comes up just after the worker).
        for _ in range(100):
            if len(_group_members(pgid, running="celery")) >= 2:
                break
            time.sleep(0.2)
        assert len(_group_members(pgid, running="celery")) >= 2, log.read_text()[-2000:]

        inner.send_signal(signal.SIGKILL)
        inner.wait(timeout=10)
        deadline = time.monotonic() + 10
        while _group_members(pgid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _group_members(pgid) == [], "workers outlived the killed test process"
    finally:
        if inner.poll() is None:
            inner.kill()
        try:
            os.killpg(int(group_file.read_text()), signal.SIGKILL)  # only if the check above failed
        except (OSError, ValueError):
            pass
