"""experience_write's round trips to Postgres: the loop writes a batch every explore step,
and each statement costs 1-5 ms on a loaded host (issue 22). Counted with Django's query log
(COPY goes through psycopg's own cursor and is not in it). Committed transactions, as the
workers run it: the staging table outlives a write only when its transaction commits."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from apps.buffer.models import Experience
from apps.buffer.services import WriteResult, experience_write
from apps.runs.models import Run
from kernel.exceptions import InvalidInput
from tests.factories import experience_row, first_task

pytestmark = [pytest.mark.django_db(transaction=True)]


def _write(run: Run, keys: list[str], **fields: Any) -> tuple[list[str], WriteResult]:
    with CaptureQueriesContext(connection) as ctx:
        result = experience_write(experiences=[experience_row(run, key=k, **fields) for k in keys])
    return [q["sql"] for q in ctx.captured_queries], result


def _keys(run: Run) -> list[str]:
    return sorted(Experience.objects.filter(run=run).values_list("key", flat=True))


def test_a_batch_of_new_rows_costs_five_statements_once_the_connection_is_set_up(run: Run) -> None:
    _write(run, ["warm"])  # the connection's first write creates its staging table
    task = first_task(run)
    sql, result = _write(run, [f"k{i}" for i in range(128)], task_id=task.pk)
    # The pipeline's run read, one look-up of runs and tasks together, BEGIN, INSERT, COMMIT
    # (was 8: a look-up each, CREATE TEMP TABLE and TRUNCATE every call).
    assert len(sql) == 5, sql
    assert not any(s.startswith(("CREATE", "TRUNCATE")) for s in sql)
    assert result.created == 128 and len(Experience.objects.filter(run=run)) == 129


def test_inside_a_callers_transaction_it_costs_no_more(run: Run) -> None:
    _write(run, ["warm"])
    with transaction.atomic():  # as the explorer writes, with its task and step records
        sql, result = _write(run, [f"k{i}" for i in range(16)])
    # Without task ids: the pipeline's run read, the run look-up, SAVEPOINT, INSERT, RELEASE.
    assert len(sql) == 5, sql
    assert not any(s.startswith(("CREATE", "TRUNCATE")) for s in sql)
    assert result.created == 16


def test_committed_writes_leave_nothing_staged_for_the_next(run: Run) -> None:
    _write(run, ["a", "b"])
    _, again = _write(run, ["b", "c"])
    assert (again.created, again.duplicates) == (1, 1)
    assert again.ids[0] == Experience.objects.get(run=run, key="b").pk
    assert _keys(run) == ["a", "b", "c"]


def test_writes_inside_a_callers_transaction_leave_nothing_staged_for_the_next(run: Run) -> None:
    _write(run, ["warm"])
    with transaction.atomic():
        first = experience_write(experiences=[experience_row(run, key="x")])
        second = experience_write(experiences=[experience_row(run, key="y")])
        third = experience_write(experiences=[experience_row(run, key="x")])
    assert (first.created, second.created, third.created, third.duplicates) == (1, 1, 0, 1)
    assert second.ids == [Experience.objects.get(run=run, key="y").pk]
    assert _keys(run) == ["warm", "x", "y"]


def test_a_write_rolled_back_with_its_callers_transaction_leaves_later_writes_working(run: Run) -> None:
    with pytest.raises(RuntimeError), transaction.atomic():  # the connection's first write
        experience_write(experiences=[experience_row(run, key="lost")])
        raise RuntimeError("caller fails")
    _, result = _write(run, ["kept"])
    assert result.created == 1 and _keys(run) == ["kept"]


def test_unknown_tasks_and_parents_are_still_named_from_the_one_look_up(run: Run) -> None:
    _, parent = _write(run, ["p"])
    with pytest.raises(InvalidInput) as err:
        experience_write(experiences=[experience_row(run, key="a", parent_id=parent.ids[0]),
                                      experience_row(run, key="b", parent_id=10**9)])
    assert err.value.field == "1.parent_id"
    with pytest.raises(InvalidInput) as err:
        experience_write(experiences=[experience_row(run, key="a", task_id=10**9)])
    assert err.value.field == "0.task_id"
    assert _keys(run) == ["p"]
