"""What SQL must show of a run that went through faults (killed workers, restarted
services, a learner rank killed mid-step) and finished: every experience consumed exactly
once, filtered with a reason, or still ready; every train step recorded once, on one whole
batch; no task attempt left leased; no experience written twice. Shared by the fault tests
(tests/test_faults.py on its own Postgres, tests/trainer on the test database)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

# (query with %s placeholders, its parameters) -> rows
Sql = Callable[[str, Sequence[Any]], list[tuple[Any, ...]]]


def django_sql(query: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    """`Sql` on the test database (Django's connection)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(query, list(params))
        return list(cursor.fetchall())


def experiences_used_once(sql: Sql, run_id: int, *, steps: int, batch: int) -> None:
    """The run trained `steps` steps of `batch` experiences each, and nothing twice."""
    by_state = sql("SELECT status, use_count, filter_reason <> '' AS has_reason, count(*) FROM buffer_experience"
                   " WHERE run_id = %s GROUP BY 1, 2, 3", [run_id])
    for status, uses, has_reason, count in by_state:
        assert (status, uses) == ("consumed", 1) or (status == "filtered" and has_reason) or (status, uses) == ("ready", 0), by_state
    consumed = sum(c for s, _, _, c in by_state if s == "consumed")
    assert consumed == steps * batch, by_state
    # Every train step recorded once, on one batch.
    claimed = sql("SELECT step, count(*), min(value) FROM runs_metric WHERE run_id = %s AND name = 'claimed'"
                  " GROUP BY step ORDER BY step", [run_id])
    assert claimed == [(s, 1, float(batch)) for s in range(1, steps + 1)], claimed
    # No task attempt was left leased, and no experience written twice by a step's copies.
    assert sql("SELECT count(*) FROM buffer_taskattempt WHERE run_id = %s AND status = 'leased'", [run_id]) == [(0,)]
    keys = sql("SELECT count(*), count(DISTINCT key) FROM buffer_experience WHERE run_id = %s", [run_id])
    assert keys[0][0] == keys[0][1], keys
