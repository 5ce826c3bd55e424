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
# Seconds summed from --durations=0 of a -n 2 run (2026-11-25, load 4-39; 4159 s in all); the
# two cut on 2026-11-26 (issue 50) are estimates from their cuts measured at load 30-40.
FIRST: tuple[str, ...] = (
    "tests/trainer/test_learner_group_task.py",  # 418
    "tests/test_bench_smokes.py",  # 339 (builds the demo model first, if no cache has it)
    # ~320, was 453 (alone, load 15-17: set-up 58, crawl 383): 352 pages and actions, was 480
    "tests/test_newcomer_crawl.py",
    "tests/test_faults.py",  # 196
    "tests/trainer/test_learner_group.py",  # 194
    # ~190, was 285: the loop's and the agent's tests at 3 steps (1147 s -> 226 s at load 35)
    "tests/learning/",
    "tests/trainer/test_model_benches.py",  # 179
    "tests/trainer/test_modes.py",  # 171
    "tests/envapi/test_openai_endpoint.py",  # 137
    "tests/dashboard/test_pages_states.py",  # 115
    "tests/dashboard/test_responsive.py",  # 103
    "tests/rewards/test_k12_graders.py",  # 98
    "tests/dashboard/test_pages_notify_bulk.py",  # 90
    "tests/test_readme_commands.py",  # 85
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
