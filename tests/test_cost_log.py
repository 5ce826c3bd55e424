"""RFT_TEST_COST_LOG (tests/cost_log.py): a line per test, summed by xdist group."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.cost_log import Cost, summary

ROOT = Path(__file__).resolve().parent.parent


def test_each_test_writes_its_costs_and_the_summary_sums_them_by_group(tmp_path: Path) -> None:
    (tmp_path / "test_spin.py").write_text(
        "import subprocess, sys\n"
        "def test_spins():\n    sum(range(3_000_000))\n"
        "def test_child():\n    subprocess.run([sys.executable, '-c', 'sum(range(3_000_000))'], check=True)\n")
    log = tmp_path / "cost.jsonl"
    env = {**os.environ, "RFT_TEST_COST_LOG": str(log), "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "tests.cost_log", "-p", "no:cacheprovider",
                           str(tmp_path / "test_spin.py")], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    lines: list[Cost] = [json.loads(text) for text in log.read_text().splitlines()]
    assert [line["test"].rsplit("::", 1)[1] for line in lines] == ["test_spins", "test_child"]
    spins, child = lines
    assert spins["cpu"] > 0 and spins["worker"] == "main" and spins["wall"] >= spins["cpu"] * 0.5
    assert child["cpu_children"] > 0  # the reaped child's CPU, not the test process's

    rows = summary([*lines, {**spins, "test": "tests/learning/test_x.py::t"},
                    {**spins, "test": "tests/learning/test_y.py::t"}])
    by_group = {group: (wall, cpu, count) for group, wall, cpu, count in rows}
    assert by_group["tests/learning/"] == (2 * spins["wall"], 2 * (spins["cpu"] + spins["cpu_children"]), 2)
    assert sum(count for _, _, _, count in rows) == 4
