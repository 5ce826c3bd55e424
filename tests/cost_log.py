"""What each test costs, for the next cut of the suite's time: with RFT_TEST_COST_LOG set to a
path, every test (its set-up and teardown included, so a module's fixtures land on its first
and last tests) appends one JSON line there: its node id, the xdist worker, the wall seconds
and the CPU seconds of the test process and of the children it reaped in that time (Celery
workers, servers, ranks: those a fixture stops and waits for). `python -m tests.cost_log FILE`
sums them by xdist group (tests/xdist_schedule.py), the costliest first."""

from __future__ import annotations

import json
import os
import sys
import time
from collections import defaultdict
from collections.abc import Generator
from pathlib import Path
from typing import TypedDict

import pytest

from tests.xdist_schedule import group_of

LOG_ENV = "RFT_TEST_COST_LOG"


class Cost(TypedDict):
    """One test's line."""

    test: str
    worker: str
    end: float  # time.time() at its end
    wall: float
    cpu: float
    cpu_children: float


def _cpu() -> tuple[float, float]:
    times = os.times()
    return times.user + times.system, times.children_user + times.children_system


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, None, None]:
    path = os.environ.get(LOG_ENV)
    if not path:
        yield
        return
    wall, (own, children) = time.monotonic(), _cpu()
    yield
    own_after, children_after = _cpu()
    line: Cost = {"test": item.nodeid, "worker": getattr(item.config, "workerinput", {}).get("workerid", "main"),
                  "end": time.time(), "wall": time.monotonic() - wall, "cpu": own_after - own,
                  "cpu_children": children_after - children}
    with open(path, "a", encoding="utf-8") as log:
        log.write(json.dumps(line) + "\n")


def summary(lines: list[Cost]) -> list[tuple[str, float, float, int]]:
    """(group, wall s, CPU s with reaped children, tests) per xdist group, the most wall first."""
    wall: dict[str, float] = defaultdict(float)
    cpu: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    for line in lines:
        group = group_of(line["test"])
        wall[group] += line["wall"]
        cpu[group] += line["cpu"] + line["cpu_children"]
        count[group] += 1
    return sorted(((g, wall[g], cpu[g], count[g]) for g in wall), key=lambda row: -row[1])


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m tests.cost_log FILE", file=sys.stderr)
        return 2
    lines: list[Cost] = [json.loads(text) for text in Path(argv[0]).read_text(encoding="utf-8").splitlines() if text]
    rows = summary(lines)
    print(f"{'wall s':>8} {'CPU s':>8} {'tests':>5}  group")
    for group, wall, cpu, count in rows:
        print(f"{wall:8.1f} {cpu:8.1f} {count:5d}  {group}")
    print(f"{sum(r[1] for r in rows):8.1f} {sum(r[2] for r in rows):8.1f} {sum(r[3] for r in rows):5d}  in all")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
