"""The results file (`--out`, `--resume`, `--report`): a `Journal` of one JSON line per
(preference, seed, arm) result, written the moment that arm is done; `seed_run`, the order the
arms run in on one seed (what the journal holds skipped); `report_from`, what a file holds."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from bench.steering.measurement import Sampled, StepProbe, measured
from bench.steering.people import RaterSpec

# What a result depends on beyond its (preference, seed, arm): a file's rows are resumed only
# under the same settings (a row run otherwise would mix into the distribution unseen).
SETTINGS = ("steps", "tasks", "repeat", "lr", "share", "rm_base", "min_rm_accuracy", "rm_kind", "noise",
            "random_raters", "noisy_raters", "max_tokens", "min_rm_heldout_pairs", "rm_confidence", "w_auto",
            "crossval_folds", "pairs", "trust", "verifier", "beta", "rm_gate", "scale_rewards", "demo_styled")
UNRATED = ("format", "auto")  # arms without people: run once per seed, read by every preference


class Journal:
    """The results file: one JSON line per (preference, seed, arm) result, appended (and flushed
    to disk) as soon as that arm is done, so a run stopped at any time keeps what finished;
    `--resume` reads it back and the loop skips what it holds. Each line carries the arm's final
    samples (a later preference reads an unrated arm's), its step probes, the base's figures for
    its preference and seed, the preference written out and the run's settings."""

    def __init__(self, path: Path | None, settings: dict[str, Any]) -> None:
        self.path, self.settings = path, settings
        self.done: dict[tuple[str, int, str], dict[str, Any]] = {}

    def read(self, raters: list[RaterSpec]) -> None:
        """Load the file's rows; a row under other settings, or a preference of the same name
        written out otherwise, is refused (ValueError); a line cut short is dropped."""
        if self.path is None or not self.path.exists():
            return
        import json
        from dataclasses import fields

        described = {r.name: r.description for r in raters}
        lines = self.path.read_text().splitlines()
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                # Cut short where a run was killed while writing it: that arm did not finish.
                print(f"{self.path}: line {number} is cut short (a run stopped while writing it): skipped")
                continue
            if row.get("settings") != self.settings:
                other = {k: v for k, v in (row.get("settings") or {}).items() if self.settings.get(k) != v}
                raise ValueError(f"{self.path}: line {number} was run with other settings ({other})")
            if row["rater"] in described and row["description"] != described[row["rater"]]:
                raise ValueError(f"{self.path}: line {number}'s {row['rater']} is another preference "
                                 f"({row['description']})")
            names = {f.name for f in fields(StepProbe)}
            row["probes"] = [StepProbe(**{k: v for k, v in p.items() if k in names}) for p in row["probes"]]
            row["samples"] = [tuple(x) for x in row["samples"]]
            self.done[row["rater"], row["seed"], row["arm"]] = row

    def unrated(self, seed: int, arm: str) -> dict[str, Any] | None:
        """A finished arm without people on `seed`, whichever preference it was read by."""
        return next((row for (_, s, a), row in self.done.items() if s == seed and a == arm), None)

    def add(self, result: dict[str, Any], rater: RaterSpec, base: Sampled) -> None:
        import json
        from dataclasses import asdict

        row = {**result, "settings": self.settings, "description": rater.description, "base": asdict(base)}
        self.done[result["rater"], result["seed"], result["arm"]] = row
        if self.path is None:
            return
        line = json.dumps({**row, "probes": [asdict(p) for p in row.get("probes") or []]})
        with self.path.open("ab+") as f:  # appends go to the end whatever was read
            size = f.seek(0, os.SEEK_END)
            if size:
                f.seek(size - 1)
                if f.read(1) != b"\n":
                    f.write(b"\n")  # after a line cut short by a kill, a line of its own
            f.write((line + "\n").encode())
            f.flush()
            os.fsync(f.fileno())


def _printable(result: dict[str, Any]) -> dict[str, Any]:
    """A result without its samples (800 completions) and step probes, for the RESULT line."""
    return {k: v for k, v in result.items() if k not in ("samples", "probes", "settings")}


def seed_run(seed: int, *, raters: list[RaterSpec], arms: list[str], base: dict[tuple[str, int], Sampled],
             journal: Journal, run: Any) -> list[dict[str, Any]]:
    """Every arm of every preference on one seed, what the journal holds skipped: the arms
    without people first (once for the seed, kept at once), then each preference's arms in
    turn, so that each (preference, seed) pair is complete before the next starts. `run(arm,
    rating, noise)` runs one arm (run_arm)."""
    resumed = set(journal.done)
    for arm in arms:
        if arm in UNRATED and journal.unrated(seed, arm) is None:
            first = raters[0]
            journal.add(measured(run(arm, first.rating, 0.0), first, base[first.name, seed]), first,
                        base[first.name, seed])
            print(f"RESULT {_printable(journal.done[first.name, seed, arm])}", flush=True)
    results = []
    for r in raters:
        for arm in arms:
            row = journal.done.get((r.name, seed, arm))
            if row is None:
                raw = (journal.unrated(seed, arm) if arm in UNRATED else None) or run(arm, r.rating, r.noise)
                journal.add(measured(raw, r, base[r.name, seed]), r, base[r.name, seed])
                row = journal.done[r.name, seed, arm]
                print(f"RESULT {_printable(row)}", flush=True)
            elif (r.name, seed, arm) in resumed:
                print(f"RESUMED {r.name} s{seed} {arm} (from {journal.path})", flush=True)
            results.append(row)
    return results


def report_from(journal: Journal, *, raters: list[RaterSpec], arms: list[str],
                seeds: list[int]) -> tuple[list[dict[str, Any]], dict[tuple[str, int], Sampled]]:
    """The results a journal holds for these preferences, seeds and arms, in the bench's order,
    and the base's figures per (preference, seed) as the rows recorded them."""
    results = [journal.done[r.name, s, a] for s in seeds for r in raters for a in arms if (r.name, s, a) in journal.done]
    base = {(row["rater"], row["seed"]): Sampled(**row["base"]) for row in results}
    return results, base
