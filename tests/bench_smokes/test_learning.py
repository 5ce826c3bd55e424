"""Smoke test of bench/learning's side-by-side mode (the real figures are a bench, minutes a
run): `--jobs 2` runs a seed's GRPO and MIX in two single-threaded child processes, and the
parent prints both curves, the median table and the target line from their results, without
the in-process loop sending steps to queues no worker reads."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

pytestmark = [pytest.mark.bench, pytest.mark.slow, pytest.mark.django_db]


def test_the_learning_bench_runs_two_algorithms_side_by_side_and_reports_both(bench: Callable[..., Any]) -> None:
    out = bench("learning", "--steps", "1", "--eval-every", "1", "--algorithms", "grpo,mix", "--seeds", "0", "--jobs", "2")
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [line.split() for line in out.stdout.splitlines()]
    # Each child's curve reached the parent: algorithm, seed, step, seconds, accuracy, gain.
    for algorithm in ("grpo", "mix"):
        assert any(row[:3] == [algorithm, "0", "1"] and len(row) == 6 for row in rows), out.stdout[-2000:]
    last = out.stdout.splitlines()[-1]
    assert "grpo median best gain within 10 min" in last and "mix vs grpo gain at step 1" in last
    assert "sent again" not in out.stdout + out.stderr


def test_the_learning_bench_refuses_an_unknown_algorithm_by_name(bench: Callable[..., Any]) -> None:
    out = bench("learning", "--algorithms", "grpo,ppo", timeout=120)
    assert out.returncode == 2
    assert "unknown algorithm 'ppo'" in out.stderr
