"""How `make test`'s two pytest-xdist workers (`pytest -n 2`) share the suite out: by module,
a package whole where its tests share a fixture wider than a module, the longest first.

Each worker tests on services of its own (rftweb/settings.py: its test database, Redis
database and VAR_DIR), so two tests that start Celery workers at once never take each
other's tasks. A test group runs on one worker in its collection order, so a module's (or a
package's) fixtures start once, as in a run without xdist."""

from __future__ import annotations

from typing import Any

import pytest

# Tests that share a fixture wider than their module run on one worker: the learning loop's
# package-wide Celery workers (tests/learning/conftest.py).
WHOLE_PACKAGES = ("tests/learning/",)
# The longest groups, longest first: handed out before the rest, so neither worker is left
# running one of them alone at the end (the rest, in collection order, take 70 s or less).
# Seconds from --durations=0 of a -n 2 run (2026-11-25, load 4-39; 4159 s in all), scaled by
# the cuts of 2026-11-26 (issue 50: each module measured before and after at -n 0, in the
# same conditions; bench/README.md and the commits say how).
FIRST: tuple[str, ...] = (
    "tests/test_bench_smokes.py",  # ~240, was ~290: reward_model's smokes hold 16 groups out, no vLLM in learners
    "tests/test_newcomer_crawl.py",  # ~220, was ~320: one crawl per person, 1280 px by resizing
    "tests/trainer/test_learner_group_task.py",  # ~220, was 418: 16 tests -> 12, five groups fewer
    "tests/learning/",  # ~190: the loop's and the agent's tests at 3 steps
    "tests/trainer/test_modes.py",  # 171
    "tests/envapi/test_openai_endpoint.py",  # ~105 (estimated), was 137: no 20 s stop, 1-token warm-ups
    "tests/trainer/test_learner_group.py",  # ~100, was 194: three processes for both groups, no vLLM import
    "tests/test_faults.py",  # ~125, was 196: the run ends two steps after the last recovery
    "tests/dashboard/test_pages_states.py",  # 115
    "tests/dashboard/test_pages_notify_bulk.py",  # 90
    "tests/test_readme_commands.py",  # 85
    "tests/trainer/test_model_benches.py",  # ~75, was 179: two settings, not four
    "tests/rewards/test_k12_graders.py",  # ~70, was 98
    "tests/trainer/test_sharded_load.py",  # ~65, was ~100: one group for the comparison and the RLIMIT test, no vLLM
)


def group_of(nodeid: str) -> str:
    """The unit of work an xdist worker takes whole: its package for WHOLE_PACKAGES, else its
    module (whose module-scoped workers, servers and models then start once)."""
    path = nodeid.split("::", 1)[0]
    return next((package for package in WHOLE_PACKAGES if path.startswith(package)), path)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In an xdist worker, FIRST's groups first, in its order, the rest as collected (both
    workers collect the same order; the scheduler hands out groups in it)."""
    if not hasattr(config, "workerinput"):
        return
    rank = {group: i for i, group in enumerate(FIRST)}
    position = {id(item): i for i, item in enumerate(items)}
    items.sort(key=lambda item: (rank.get(group_of(item.nodeid), len(rank)), position[id(item)]))


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getvalue("dist") not in {"load", "loadscope", "loadfile", "loadgroup"}:
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        """xdist's scope scheduling, group_of as the scope, in collection order."""

        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

    config.option.loadscopereorder = False
    return GroupScheduling(config, log)
