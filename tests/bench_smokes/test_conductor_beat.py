"""Smoke test of bench/conductor_beat: both steady states run and print their statements and
CPU per beat (the figures themselves are the bench's business), and the async state's beat
counts no buffer (it would print 6 statements, not 4)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest

pytestmark = [pytest.mark.bench, pytest.mark.slow]


def test_the_conductor_beat_bench_prints_each_states_statements_and_cpu(bench: Callable[..., Any]) -> None:
    done = bench("conductor_beat", "--beats", "5", "--repeat", "1", timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = dict(re.findall(r"^(async|idle)\s+(\d+) statements a beat, [0-9.]+ ms CPU a beat\s+\(load", done.stdout, re.M))
    assert set(rows) == {"async", "idle"}, done.stdout
    assert int(rows["async"]) <= 4, done.stdout
    assert re.search(r"^async median [0-9.]+ ms, spread", done.stdout, re.M)
