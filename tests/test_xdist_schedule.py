"""`make test`'s xdist workers take the suite in groups (tests/xdist_schedule.py)."""

from __future__ import annotations

import importlib
from pathlib import Path

from tests.xdist_schedule import EACH_TEST, FIRST, WHOLE_PACKAGES, group_of

ROOT = Path(__file__).resolve().parent.parent


def test_a_group_is_a_module_or_a_whole_package_that_shares_workers() -> None:
    assert group_of("tests/trainer/test_modes.py::test_x[a]") == "tests/trainer/test_modes.py"
    assert group_of("tests/test_faults.py::test_y") == "tests/test_faults.py"
    assert group_of("tests/learning/test_learning.py::test_z") == "tests/learning/"
    assert group_of("tests/learning/test_calculator_agent.py::test_z") == "tests/learning/"
    # The benches' smokes share nothing wider than the session: both workers take them.
    smoke = "tests/bench_smokes/test_benches.py::test_the_bench_runs_on_tiny_sizes_and_prints_its_ratio[pipeline]"
    assert group_of(smoke) == smoke


def test_the_groups_handed_out_first_exist() -> None:
    # A renamed module would silently go back to the end of the queue.
    groups = FIRST + WHOLE_PACKAGES + EACH_TEST
    assert all((ROOT / group).exists() for group in groups), [g for g in groups if not (ROOT / g).exists()]
    assert len(set(FIRST)) == len(FIRST)


def test_every_bench_smoke_is_marked_bench() -> None:
    """`make test` skips tests/bench_smokes/ and `make test-bench` takes only what is marked
    `bench`: an unmarked smoke module would run in neither."""
    def marks(path: Path) -> set[str]:
        found = getattr(importlib.import_module(f"tests.bench_smokes.{path.stem}"), "pytestmark", [])
        return {mark.name for mark in (found if isinstance(found, list) else [found])}

    modules = sorted((ROOT / "tests" / "bench_smokes").glob("test_*.py"))
    assert modules and [path.name for path in modules if "bench" not in marks(path)] == []
