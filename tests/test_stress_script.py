"""`make test-stress` (scripts/stress.py): every round runs the modules beside busy loops, and
the exit status is 0 only when every round passed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.servers import ROOT


def _stress(tmp_path: Path, body: str, rounds: int) -> subprocess.CompletedProcess[str]:
    module = tmp_path / "test_probe.py"
    module.write_text(body)
    # `-c /dev/null`: the probe module alone, without the project's pytest configuration.
    return subprocess.run([sys.executable, "scripts/stress.py", "--rounds", str(rounds), "--loops", "1", str(module),
                           "--", "-c", "/dev/null", "-q", "-p", "no:cacheprovider"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_two_passing_rounds_beside_a_busy_loop_pass(tmp_path: Path) -> None:
    done = _stress(tmp_path, "def test_ok() -> None:\n    pass\n", rounds=2)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert done.stdout.count(": passed in") == 2 and "beside 1 busy loops, load " in done.stdout
    assert "stress: 2 of 2 rounds passed" in done.stdout


def test_a_failing_round_fails_the_check(tmp_path: Path) -> None:
    # One round: a round's pytest and its busy loop cost seconds of CPU, and one failed round
    # fails the check as two would.
    done = _stress(tmp_path, "def test_bad() -> None:\n    assert False\n", rounds=1)
    assert done.returncode == 1, done.stdout[-2000:]
    assert "FAILED (exit 1)" in done.stdout and "stress: 0 of 1 rounds passed" in done.stdout


def test_a_module_that_does_not_exist_is_refused_naming_it() -> None:
    done = subprocess.run([sys.executable, "scripts/stress.py", "tests/no_such_module.py"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "no such test module: tests/no_such_module.py" in done.stderr
    assert "Traceback" not in done.stderr
