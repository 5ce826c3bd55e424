"""Benches never share state by accident (issue 62.8): two benches set up at once each get a
database of their own, made and migrated side by side and dropped when they end; two
processes set up one named database at once take turns (neither meets "relation already
exists"); and a bench's window ending leaves the windows of runs it did not make alone."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest
from django.db import connection
from django.utils import timezone

from apps.buffer.models import Experience
from apps.buffer.services import experience_write
from bench.common import bench_database_url, wait_windows_end
from tests.factories import experience_row, make_run, make_user

ROOT = Path(__file__).resolve().parents[1]

# A bench's set-up as the benches do it: wait for "go" (so that both start together), set
# Django up on the bench's database, say which database and how many migrations it holds,
# then wait until told to end (the database is dropped as the process ends).
SETUP = """
import sys
from bench.common import setup_django
sys.stdin.readline()
url = sys.argv[1] if len(sys.argv) > 1 else None
setup_django(database_url=url)
from django.db import connection
with connection.cursor() as cursor:
    cursor.execute("SELECT count(*) FROM django_migrations")
    print(connection.settings_dict["NAME"], cursor.fetchone()[0], flush=True)
sys.stdin.readline()
"""


def _server() -> str:
    s = connection.settings_dict
    return f"postgres://{s.get('HOST') or 'localhost'}:{s.get('PORT') or 5432}"


def _databases(prefix: str) -> set[str]:
    with psycopg.connect(f"{_server()}/postgres", autocommit=True) as admin:
        rows = admin.execute("SELECT datname FROM pg_database WHERE datname LIKE %s",
                             (prefix.replace("_", "\\_") + "%",)).fetchall()
    return {row[0] for row in rows}


@pytest.fixture
def base(db: None) -> Iterator[str]:
    """A bench database name of this test alone (and whatever a failed run left, dropped after)."""
    name = f"{connection.settings_dict['NAME']}_benchdb"
    yield f"{_server()}/{name}"
    with psycopg.connect(f"{_server()}/postgres", autocommit=True) as admin:
        for left in _databases(name):
            admin.execute(f'DROP DATABASE IF EXISTS "{left}" WITH (FORCE)')


def _together(base: str, *argv: str) -> list[tuple[str, int]]:
    """Two set-ups started together (migrating from nothing: no template); each one's database
    name and migration count, read while both are still alive."""
    env = {k: v for k, v in os.environ.items() if k not in ("BENCH_DATABASE_TEMPLATE", "BENCH_OWN_DATABASE_URL")}
    env.update(BENCH_DATABASE_URL=base, PYTHONPATH=str(ROOT))
    procs = [subprocess.Popen([sys.executable, "-c", SETUP, *argv], cwd=ROOT, env=env, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    seen = []
    for proc in procs:
        assert proc.stdout is not None
        line = proc.stdout.readline().split()
        assert line, proc.communicate(timeout=60)[1]
        seen.append((line[0], int(line[1])))
    for proc in procs:
        _, err = proc.communicate("end\n", timeout=60)
        assert proc.returncode == 0, err
    return seen


def test_two_benches_set_up_at_once_each_get_their_own_database_and_drop_it(base: str) -> None:
    name = base.rsplit("/", 1)[1]
    seen = _together(base)
    (first, first_migrations), (second, second_migrations) = seen
    assert first != second
    assert first.startswith(f"{name}_") and second.startswith(f"{name}_")
    assert first_migrations > 0 and first_migrations == second_migrations
    assert _databases(name) == set(), "each bench drops its database as it ends"


def test_two_processes_setting_up_one_named_database_take_turns(base: str) -> None:
    shared = f"{base}_shared"
    seen = _together(base, shared)
    assert [n for n, _ in seen] == [shared.rsplit("/", 1)[1]] * 2
    assert seen[0][1] > 0 and seen[0][1] == seen[1][1]


def test_a_bench_database_is_named_by_the_bench_and_the_process_within_63_bytes() -> None:
    url = bench_database_url("postgres://db:5432/" + "x" * 70, bench="steering", pid=4242)
    name = url.rsplit("/", 1)[1]
    assert name.endswith("_steering_4242") and len(name) == 63
    assert bench_database_url("postgres://db:5432/rftweb_bench", bench="-c", pid=7).endswith("/rftweb_bench__c_7")


@pytest.mark.django_db
def test_a_bench_ends_the_windows_of_its_own_runs_and_leaves_another_runs_alone() -> None:
    owner = make_user("olga")
    feedback = {"mode": "blend", "wait_seconds": 60, "fallback": "auto"}
    mine, theirs = (make_run(owner=owner, name=name, feedback=feedback) for name in ("mine", "theirs"))
    for run in (mine, theirs):
        experience_write(experiences=[experience_row(run, group="g", status="pending", reward=None, auto_reward=float(i))
                                      for i in range(2)])

    ready, dropped = wait_windows_end(run_ids=[mine.pk], now=timezone.now() + timedelta(days=1))

    assert (ready, dropped) == (1, 0)
    assert set(Experience.objects.filter(run=mine).values_list("status", flat=True)) == {Experience.Status.READY}
    assert set(Experience.objects.filter(run=theirs).values_list("status", flat=True)) == {Experience.Status.PENDING}
