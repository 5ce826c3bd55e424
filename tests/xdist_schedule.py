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
# running one of them alone at the end (the rest, in collection order, take 60 s or less).
# Seconds: each group's wall in a -n 2 run from a fresh cache (RFT_TEST_COST_LOG,
# tests/cost_log.py; 2026-11-27, 2546 s in all beside a bench at nice 19, load 2-10). The
# second is one that does not need the demo model: the first group's worker builds it (~110 s
# on a fresh clone, as in CI) while the other would otherwise wait on its lock.
FIRST: tuple[str, ...] = (
    "tests/test_bench_smokes.py",  # 718, 114 of them waiting for the demo model
    "tests/envapi/test_openai_endpoint.py",  # 202
    "tests/test_newcomer_crawl.py",  # 301
    "tests/learning/",  # 183: the loop's and the agent's tests at 3 steps
    "tests/test_faults.py",  # 159
    "tests/trainer/test_learner_group_task.py",  # 157
    "tests/dashboard/test_pages_states.py",  # 142
    "tests/trainer/test_sharded_load.py",  # 131
    "tests/dashboard/test_pages_round2.py",  # 125
    "tests/test_readme_commands.py",  # 93
    "tests/workers/test_explorer.py",  # 84
    "tests/dashboard/test_responsive.py",  # 83
    "tests/workers/test_demo_model.py",  # 82
    "tests/trainer/test_learner_group.py",  # 67
    "tests/dashboard/test_pages_live.py",  # 65
    "tests/envapi/test_live.py",  # 62
    "tests/vision/test_vllm_vision.py",  # 61
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
