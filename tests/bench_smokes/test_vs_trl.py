"""Smoke test of bench/vs_trl (the full comparison is a bench, minutes to hours): one step of
stock TRL and of rftweb's in-process loop on the demo model run through to the ratio line (a
second step measured nothing a smoke asserts: 863 s at load 35 for two)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

pytestmark = [pytest.mark.bench, pytest.mark.slow, pytest.mark.django_db]


def test_the_vs_trl_bench_runs_both_one_process_arms_and_prints_the_ratio(bench: Callable[..., Any]) -> None:
    out = bench("vs_trl", "--steps", "1", "--eval-every", "1", "--arms", "trl,inproc", "--cores", "1", "--repeat", "1")
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    # The curve rows: repeat, arm, step, seconds, accuracy, gain.
    rows = [line.split() for line in lines]
    # One repeat: the smoke shows the arms run side by side, not that their ratio holds.
    assert any(row[:3] == ["1", "trl", "1"] and len(row) == 6 for row in rows), out.stdout[-2000:]
    assert any(row[:3] == ["1", "inproc", "1"] and len(row) == 6 for row in rows), out.stdout[-2000:]
    assert "(b)/(a) s/step" in lines[-1]
