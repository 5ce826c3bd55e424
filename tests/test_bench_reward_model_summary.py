"""bench/reward_model's summary over a drawn family, recomputed from the rows: each kind's mean
over the fits, its median over the preferences, the mixed preferences' mean apart, and the
verdict line's best kind."""

from __future__ import annotations

import statistics

import pytest


def test_the_family_summary_reads_each_kind_off_the_rows(capsys: pytest.CaptureFixture[str]) -> None:
    from bench.reward_model import _summary

    acc = {("head", "generated:0"): 0.87, ("head", "generated:1"): 0.67, ("head", "generated:2"): 0.77,
           ("mlp", "generated:0"): 0.86, ("mlp", "generated:1"): 0.70, ("mlp", "generated:2"): float("nan")}
    rows = [(f"{kind}/policy", pref, 200, 0, a, 500) for (kind, pref), a in acc.items()]
    _summary(rows, kinds=["head", "mlp"], bases=["policy"], labels=[200], mixed={"generated:1", "generated:2"},
             family=True)
    out = capsys.readouterr().out
    head_mean = (0.87 + 0.67 + 0.77) / 3
    assert f"head/policy        labels  200: held-out accuracy mean {head_mean:.3f} (min 0.670, max 0.870, 3 fits)" in out
    assert f"median over preferences {statistics.median([0.87, 0.67, 0.77]):.3f}, mixed {(0.67 + 0.77) / 2:.3f} (2), " \
           "style only 0.870 (1)" in out
    # A fit that measured nothing (nan) is left out of the means, not counted as 0.
    assert f"mlp/policy         labels  200: held-out accuracy mean {(0.86 + 0.70) / 2:.3f} (min 0.700, max 0.860, " \
           "2 fits)" in out
    assert "median over preferences 0.780, mixed 0.700 (1), style only 0.860 (1): 0=0.86 1=0.70\n" in out
    assert f"reward model mlp/policy: held-out pairwise accuracy at 200 labels {0.78:.3f}, on the mixed preferences " \
           "0.700" in out
    assert f"reward model held-out pairwise accuracy at 200 labels: {0.78:.3f} with mlp/policy" in out
