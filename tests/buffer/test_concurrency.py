"""Concurrent claimers on real Postgres: no experience twice, none lost, not even when a
claimer dies holding a lease."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from apps.buffer.models import Experience
from apps.buffer.services import experience_write, lease_reap
from apps.runs.models import Run
from tests.factories import experience_row
from tests.servers import child_env

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

CLAIMER = Path(__file__).with_name("claimer.py")


def _spawn(run: Run, worker: str, size: int, *flags: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(CLAIMER), str(run.pk), worker, str(size), *flags],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env(),
    )


def _claimed(proc: subprocess.Popen[str]) -> list[int]:
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    return [pk for line in out.splitlines() for pk in json.loads(line)]


@pytest.fixture
def filled_run(run: Run) -> Run:
    rows = [experience_row(run, key=f"k{i}", group=f"g{i // 4}", priority=float(i % 7)) for i in range(2000)]
    experience_write(experiences=rows)
    return run


def test_eight_claimers_never_get_the_same_experience_and_consume_each_once(filled_run: Run, tmp_path: Path) -> None:
    procs = [_spawn(filled_run, f"w{i}", 32, "--gate", str(tmp_path)) for i in range(8)]
    # Released together once all eight are up (claimer.py --gate): under load the first could
    # otherwise empty the buffer alone, and "spread over several" would be the scheduler's luck.
    deadline = time.monotonic() + 300
    while len(list(tmp_path.glob("ready-*"))) < 8:
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs), "a claimer did not start"
        time.sleep(0.05)
    (tmp_path / "go").touch()
    claims = [_claimed(p) for p in procs]
    every = [pk for claim in claims for pk in claim]
    assert len(every) == len(set(every)) == 2000
    assert sum(1 for claim in claims if claim) >= 2, "the work should spread over several claimers"
    statuses = set(Experience.objects.filter(run=filled_run).values_list("status", "use_count"))
    assert statuses == {("consumed", 1)}


def test_eight_group_claimers_take_whole_groups_only(filled_run: Run) -> None:
    procs = [_spawn(filled_run, f"g{i}", 16, "--group") for i in range(8)]
    claims = [_claimed(p) for p in procs]
    every = [pk for claim in claims for pk in claim]
    assert len(every) == len(set(every)) == 2000
    groups = dict(Experience.objects.filter(run=filled_run).values_list("pk", "group_id"))
    for claim in claims:
        by_group: dict[str, int] = {}
        for pk in claim:
            by_group[groups[pk]] = by_group.get(groups[pk], 0) + 1
        assert set(by_group.values()) <= {4}


def test_a_claimer_killed_with_sigkill_loses_nothing(filled_run: Run) -> None:
    victim = _spawn(filled_run, "victim", 100, "--hold")
    assert victim.stdout is not None
    held = json.loads(victim.stdout.readline())
    assert len(held) == 100
    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=10)
    assert Experience.objects.filter(pk__in=held, status="leased", lease_owner="victim").count() == 100
    time.sleep(2.2)  # the victim's lease was 2 s
    assert lease_reap().experiences == 100
    survivors = [_spawn(filled_run, f"s{i}", 64) for i in range(4)]
    every = [pk for p in survivors for pk in _claimed(p)]
    assert len(every) == len(set(every)) == 2000
    assert set(held) <= set(every)
    assert Experience.objects.filter(run=filled_run, status="consumed", use_count=1).count() == 2000
