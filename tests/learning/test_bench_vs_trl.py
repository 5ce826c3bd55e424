"""Smoke test of bench/vs_trl (the full comparison is a bench, minutes to hours): two steps of
stock TRL and of rftweb's in-process loop on the demo model run through to the ratio line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow, pytest.mark.django_db]


def test_the_vs_trl_bench_runs_both_one_process_arms_and_prints_the_ratio(demo_model_dir: Path) -> None:
    from django.db import connection

    db = connection.settings_dict
    env = {
        **os.environ,
        "BENCH_DATABASE_URL": f"postgres://{db.get('HOST') or 'localhost'}:{db.get('PORT') or 5432}/{db['NAME']}_bench",
        "PYTHONPATH": str(ROOT),
        "BENCH_DEMO_DIR": str(demo_model_dir),
    }
    env.pop("TEST_DATABASE_NAME", None)
    out = subprocess.run(
        [sys.executable, "-m", "bench.vs_trl", "--steps", "2", "--eval-every", "2", "--arms", "trl,inproc", "--cores", "1",
         "--repeat", "1"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    # The curve rows: repeat, arm, step, seconds, accuracy, gain.
    rows = [line.split() for line in lines]
    # One repeat: the smoke shows the arms run side by side, not that their ratio holds.
    assert any(row[:3] == ["1", "trl", "2"] and len(row) == 6 for row in rows), out.stdout[-2000:]
    assert any(row[:3] == ["1", "inproc", "2"] and len(row) == 6 for row in rows), out.stdout[-2000:]
    assert "(b)/(a) s/step" in lines[-1]
