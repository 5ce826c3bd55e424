"""How `make test`'s three pytest-xdist workers (`pytest -n 3`; `make test-bench`'s two) share
the suite out: by module, a package whole where its tests share a fixture wider than a module,
a bench smoke alone, the longest first.

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
# The benches' smokes (`make test-bench`): each runs its bench in a process of its own on the
# worker's bench database and shares no fixture wider than the session's demo model, so each
# test is a group of its own and both workers take them.
EACH_TEST = ("tests/bench_smokes/",)
# The longest groups, longest first: handed out before the rest, so neither worker is left
# running one of them alone at the end (the rest, in collection order, take 40 s or less).
# Seconds: each group's wall in a -n 2 run from a fresh cache (RFT_TEST_COST_LOG,
# tests/cost_log.py; 2026-11-27 09:09 UTC, 1635 s in all with the benches' smokes, quiet).
# The first does not need the demo model: the second group's worker builds it (~110 s on a
# fresh clone, as in CI) while the first's runs.
FIRST: tuple[str, ...] = (
    "tests/trainer/test_learner_gang_task.py",  # ~180: 104 measured, +75 for the lost-rank test (h5, not re-measured)
    "tests/envapi/test_openai_endpoint.py",  # 171
    "tests/test_newcomer_crawl.py",  # 118
    "tests/dashboard/test_pages_states.py",  # 85
    "tests/trainer/test_sharded_load.py",  # 75
    "tests/vision/test_vllm_vision.py",  # 65
    "tests/workers/test_explorer.py",  # 64
    "tests/test_faults.py",  # 64
    "tests/workers/test_demo_model.py",  # 62
    "tests/dashboard/test_pages_round2.py",  # 61
    "tests/test_readme_commands.py",  # 55
    "tests/feedback/test_raters_browser.py",  # 40
    "tests/learning/",  # 40: the loop's and the agent's tests at 3 steps
    "tests/trainer/test_modes.py",  # 40
)


def group_of(nodeid: str) -> str:
    """The unit of work an xdist worker takes whole: its package for WHOLE_PACKAGES, the test
    itself for EACH_TEST, else its module (whose module-scoped workers, servers and models
    then start once)."""
    path = nodeid.split("::", 1)[0]
    if path.startswith(EACH_TEST):
        return nodeid
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
