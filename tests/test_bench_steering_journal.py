"""bench/steering's results file (`--out`, `--resume`, `--report`): a run stopped at any time
keeps every (preference, seed, arm) that finished, and a resumed run runs only what is left,
reading the arm without people that already ran, to the same results as a run never stopped."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench.steering.journal import Journal, report_from, seed_run
from bench.steering.measurement import Sampled, StepProbe
from bench.steering.people import RaterSpec

SETTINGS = {"steps": 30, "beta": 0.6, "rm_gate": "evidence"}
ARMS = ["all", "rm10", "format"]


def _likes(word: str) -> Any:
    return lambda prompt, completion: 5 if word in completion else 1


RATERS = [RaterSpec(name="generated:0", rating=_likes("x"), noise=0.0, description="likes x", mixed=False),
          RaterSpec(name="generated:1", rating=_likes("y"), noise=0.1, description="likes y", mixed=True)]
BASE = {(r.name, 0): Sampled(share=0.25, arithmetic=0.0, untagged=1.0) for r in RATERS}


class Stopped(Exception):
    pass


class Runs:
    """A stand-in for run_arm: each arm's samples name the arm; stops (as a kill would) after
    `stop_after` runs."""

    def __init__(self, stop_after: int | None = None) -> None:
        self.calls: list[tuple[str, float]] = []
        self.stop_after = stop_after

    def __call__(self, arm: str, rating: Any, noise: float) -> dict[str, Any]:
        if self.stop_after is not None and len(self.calls) == self.stop_after:
            raise Stopped
        self.calls.append((arm, noise))
        samples = [("p", {"all": "x y", "rm10": "x", "format": "y"}[arm])] * 3 + [("p", "z")]
        probe = StepProbe(version=1, accuracy=0.9, heldout=10, bound=0.6, open=True, weight=0.4, slope=1.0, groups=8,
                          rm_groups=7, signal_groups=5, rm_sd=0.1, format_sd=0.0, batch_sd=0.2,
                          labels={"rule": 5, "random": 1}, pairs_apart=2, pairs_alike=1)
        return {"arm": arm, "seed": 0, "load": 3.0, "labels": 6, "samples": samples,
                "probes": [probe] if arm == "rm10" else []}


def _run(journal: Journal, runs: Runs) -> list[dict[str, Any]]:
    return seed_run(0, raters=RATERS, arms=ARMS, base=BASE, journal=journal, run=runs)


def _figures(rows: list[dict[str, Any]]) -> list[tuple[str, str, float, float]]:
    return sorted((r["rater"], r["arm"], r["share"], r["share_gain"]) for r in rows)


def test_a_stopped_run_keeps_what_finished_and_a_resumed_one_runs_only_the_rest(tmp_path: Path) -> None:
    whole = _run(Journal(None, SETTINGS), Runs())
    path = tmp_path / "steering.jsonl"
    # Stopped during generated:0's rm10: `format` (once for the seed) and generated:0's `all` are kept.
    with pytest.raises(Stopped):
        _run(Journal(path, SETTINGS), Runs(stop_after=2))
    with path.open("a") as f:
        f.write('{"rater": "generated:0", "se')  # the line being written when it was killed
    kept = Journal(path, SETTINGS)
    kept.read(RATERS)
    assert sorted(kept.done) == [("generated:0", 0, "all"), ("generated:0", 0, "format")]

    runs = Runs()
    resumed = _run(kept, runs)
    # The people's arms left, each under its preference's noise; `format` is not run again.
    assert runs.calls == [("rm10", 0.0), ("all", 0.1), ("rm10", 0.1)]
    assert _figures(resumed) == _figures(whole)
    assert all(isinstance(p, StepProbe) for r in resumed + whole for p in r["probes"])
    # generated:1 reads `format`'s samples by its own preference: 3 of 4 have its word.
    assert next(r for r in resumed if r["rater"] == "generated:1" and r["arm"] == "format")["share"] == 0.75
    # The file now holds all six, probes included, and --report reads them in the bench's order.
    again = Journal(path, SETTINGS)
    again.read(RATERS)
    rows, base = report_from(again, raters=RATERS, arms=ARMS, seeds=[0])
    assert [(r["rater"], r["arm"]) for r in rows] == [(r.name, a) for r in RATERS for a in ARMS]
    assert base == BASE
    rm10 = next(r for r in rows if r["arm"] == "rm10")
    assert rm10["probes"][0].weight == 0.4 and rm10["probes"][0].labels == {"rule": 5, "random": 1}


def test_a_results_file_of_other_settings_or_another_preference_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "steering.jsonl"
    _run(Journal(path, SETTINGS), Runs())
    with pytest.raises(ValueError, match="other settings.*rm_gate"):
        Journal(path, {**SETTINGS, "rm_gate": "bound"}).read(RATERS)
    other = [RaterSpec(name="generated:0", rating=_likes("x"), noise=0.0, description="likes w", mixed=False)]
    with pytest.raises(ValueError, match="another preference"):
        Journal(path, SETTINGS).read(other)
