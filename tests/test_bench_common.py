"""bench/common.py's process stop: a server that will not stop on SIGTERM is stopped anyway,
named on stderr, and leaves its Python stacks in its log; one that stops is stopped quietly."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.common import processes_stop, server_env

# Ignores SIGTERM (as a server stuck in its shutdown does), says so, then waits in a function
# whose name the stack dump must show.
STUBBORN = """
import signal, time
def stuck_in_shutdown():
    print("ready", flush=True)
    while True:
        time.sleep(0.05)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
stuck_in_shutdown()
"""


def _start(code: str, *, log: Path, group: bool = False) -> subprocess.Popen[str]:
    with log.open("w") as stderr:  # the child holds its own copy
        proc = subprocess.Popen([sys.executable, "-c", code], env=server_env(dict(os.environ)), stdout=subprocess.PIPE,
                                stderr=stderr, text=True, start_new_session=group)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    return proc


def test_a_process_that_ignores_sigterm_is_aborted_named_and_leaves_its_stack(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    log = tmp_path / "server.log"
    proc = _start(STUBBORN, log=log)
    processes_stop([proc], timeout=1)
    assert proc.returncode == -signal.SIGABRT
    assert "had not exited 1 s after SIGTERM: stopping it with SIGABRT" in capsys.readouterr().err
    assert "stuck_in_shutdown" in log.read_text()  # faulthandler's dump, from server_env


def test_a_process_that_stops_on_sigterm_is_stopped_without_a_word(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    proc = _start("print('ready', flush=True); import time; time.sleep(600)", log=tmp_path / "server.log")
    processes_stop([proc], timeout=30)
    assert proc.returncode == -signal.SIGTERM
    assert capsys.readouterr().err == ""


def test_a_group_is_stopped_with_a_member_that_ignores_sigterm(tmp_path: Path) -> None:
    # The leader starts a member that ignores SIGTERM, and exits on SIGTERM itself: the member
    # must still be stopped (a uvicorn's workers, a demo server's children).
    member_pid = tmp_path / "member.pid"
    leader = (f"import subprocess, sys, time; m = subprocess.Popen([sys.executable, '-c', {STUBBORN!r}], "
              "stdout=subprocess.PIPE, text=True); m.stdout.readline(); "
              f"open({str(member_pid)!r}, 'w').write(str(m.pid)); print('ready', flush=True); time.sleep(600)")
    proc = _start(leader, log=tmp_path / "server.log", group=True)
    member = Path(f"/proc/{member_pid.read_text()}/status")
    processes_stop([proc], timeout=1, group=True)
    assert proc.returncode == -signal.SIGTERM  # the leader stopped on its SIGTERM
    deadline = time.monotonic() + 60
    while member.exists() and "zombie" not in member.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)  # the SIGKILL is sent; the member's end is what is waited for
    assert not member.exists() or "zombie" in member.read_text()
