"""The buffer's write and claim services.

Claims use `SELECT … FOR UPDATE SKIP LOCKED` and a lease that expires: concurrent claimers
never get the same row, and a claimer that dies loses nothing (`lease_reap` hands its rows
back).
"""

from __future__ import annotations

import json
import random
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TypeVar

from django.conf import settings
from django.db import connection, models, transaction
from django.db.models import F, Q, QuerySet
from django.utils import timezone

from apps.buffer.drafts import ExperienceDraft, drafts_from_rows
from apps.buffer.models import Experience, Task, TaskAttempt
from apps.buffer.pipeline import (
    pipeline_apply_on_claim,
    pipeline_apply_on_write,
    task_priorities_refresh,
)
from apps.buffer.selectors import experiences_claimable, experiences_in_whole_groups
from apps.runs.events import event_publish_many, labels_changed_publish
from apps.runs.metrics import metric_announce, metric_values_clean
from apps.runs.models import Metric, Run
from kernel.exceptions import InvalidInput
from kernel.jsontypes import Body


@dataclass(frozen=True)
class WriteResult:
    """What a write stored: `ids[i]` is the experience of the caller's draft i, new or
    already there (`is_new[i]` says which)."""

    created: int
    duplicates: int
    ids: list[int]
    is_new: list[bool]


def experience_write(*, experiences: Sequence[ExperienceDraft], announce: bool = False) -> WriteResult:
    """Insert a batch of experiences in one transaction, idempotent on (run, key).

    Drafts are checked when built (ExperienceDraft); here the batch is checked as a whole
    (a key twice, unknown runs, tasks or parents) and a bad one refused with InvalidInput
    naming `<row>.<field>`, writing nothing. Rows whose key the run already holds are
    skipped and counted as duplicates. `announce`: publish `experience.created` for each
    new experience once the transaction commits (the payload is the draft's).
    """
    for i, draft in enumerate(experiences):
        if not isinstance(draft, ExperienceDraft):
            raise TypeError(f"experience_write takes ExperienceDraft, got {type(draft).__name__} at row {i}")
    # Data pipeline (apps/buffer/pipeline): the run's on_write operators see plain rows;
    # rows they remove stay in the batch as status "filtered" with their filter_reason.
    # What they hand back (copies) is checked again as drafts.
    rows, pipeline_done = pipeline_apply_on_write(experiences=experiences)
    drafts = drafts_from_rows(rows) if rows is not experiences else list(experiences)
    if not drafts:
        return WriteResult(created=0, duplicates=0, ids=[], is_new=[])

    seen: dict[tuple[int, str], int] = {}
    for i, d in enumerate(drafts):
        ident = (d.run_id, d.key)
        if ident in seen:
            raise InvalidInput(f"key {d.key!r} repeats row {seen[ident]}", field=f"{i}.key")
        seen[ident] = i

    known_runs, known_tasks, known_parents = _known_ids(
        run_ids={d.run_id for d in drafts},
        task_ids={d.task_id for d in drafts if d.task_id is not None},
        parent_ids={d.parent_id for d in drafts if d.parent_id is not None},
    )
    for i, d in enumerate(drafts):
        if d.run_id not in known_runs:
            raise InvalidInput(f"unknown run {d.run_id}", field=f"{i}.run_id")
        if d.task_id is not None and d.task_id not in known_tasks:
            raise InvalidInput(f"unknown task {d.task_id}", field=f"{i}.task_id")
        if d.parent_id is not None and d.parent_id not in known_parents:
            raise InvalidInput(f"unknown parent experience {d.parent_id}", field=f"{i}.parent_id")

    with transaction.atomic():
        fresh = _insert_by_copy(drafts)
        ids = _ids_in_order(drafts, fresh)
        is_new = [(d.run_id, d.key) in fresh for d in drafts]
        if announce:
            _announce_on_commit(drafts=drafts, ids=ids, is_new=is_new)
    pipeline_done()  # the pipeline's deferred work and metrics, once the batch is stored
    return WriteResult(created=len(fresh), duplicates=len(drafts) - len(fresh), ids=ids, is_new=is_new)


def _known_ids(*, run_ids: set[int], task_ids: set[int], parent_ids: set[int]) -> tuple[set[int], set[int], set[int]]:
    """Which of these runs, tasks and parent experiences exist, in one round trip (a UNION
    ALL of the three look-ups) instead of one each: the loop writes a batch every step."""
    kinds: list[tuple[str, type[Run] | type[Task] | type[Experience], set[int]]] = [("r", Run, run_ids), ("t", Task, task_ids), ("p", Experience, parent_ids)]
    queries = [
        model.objects.filter(pk__in=ids).order_by().annotate(kind=models.Value(kind)).values_list("kind", "pk")
        for kind, model, ids in kinds
        if ids
    ]
    found: dict[str, set[int]] = {"r": set(), "t": set(), "p": set()}
    if queries:
        for kind, pk in queries[0].union(*queries[1:], all=True):
            found[kind].add(pk)
    return found["r"], found["t"], found["p"]


def _announce_on_commit(*, drafts: Sequence[ExperienceDraft], ids: Sequence[int], is_new: Sequence[bool]) -> None:
    by_run: dict[int, list[tuple[str, Body]]] = {}
    for d, pk, new in zip(drafts, ids, is_new, strict=True):
        if new:
            by_run.setdefault(d.run_id, []).append(("experience.created", d.event_payload(id=pk)))

    def publish() -> None:
        for run_id, events in by_run.items():
            event_publish_many(run_id=run_id, events=events)

    if by_run:
        transaction.on_commit(publish)


def _ids_in_order(drafts: Sequence[ExperienceDraft], fresh: dict[tuple[int, str], int]) -> list[int]:
    found = dict(fresh)
    missing: dict[int, list[str]] = {}
    for d in drafts:
        if (d.run_id, d.key) not in found:
            missing.setdefault(d.run_id, []).append(d.key)
    for run_id, keys in missing.items():
        for pk, key in Experience.objects.filter(run_id=run_id, key__in=keys).values_list("id", "key"):
            found[(run_id, key)] = pk
    return [found[(d.run_id, d.key)] for d in drafts]


_COPY_FIELDS = [f for f in Experience._meta.concrete_fields if f.attname != "id"]
_JSON_FIELDS = {f.attname for f in _COPY_FIELDS if isinstance(f, models.JSONField)}
# Columns a draft does not carry (lease and use bookkeeping): their defaults, computed once.
_COPY_PLAN = [
    (f.attname, f.attname in _JSON_FIELDS, f.attname in ExperienceDraft.__dataclass_fields__, f.get_default())
    for f in _COPY_FIELDS
]


def _copy_values(draft: ExperienceDraft, now: datetime) -> list[object]:
    values: list[object] = []
    for name, is_json, carried, default in _COPY_PLAN:
        if name == "created_at":
            values.append(now)
            continue
        value = getattr(draft, name) if carried else default
        if value is None and name == "priority":
            value = 0.0  # the writer chose none (see ExperienceDraft.priority)
        elif is_json and value is not None:
            value = json.dumps(value)
        values.append(value)
    return values


# The psycopg connections whose session holds the staging table `experience_in` (a temp
# table lives as long as its session): created once per connection, not once per write.
# Weak, so a connection Django closes is forgotten with it.
_STAGING_READY: weakref.WeakSet[object] = weakref.WeakSet()


def _insert_by_copy(drafts: Sequence[ExperienceDraft]) -> dict[tuple[int, str], int]:
    """COPY into a temporary table, then one INSERT … ON CONFLICT DO NOTHING RETURNING: close
    to raw COPY speed, the conflict clause makes concurrent writers of one key safe, and
    RETURNING names the new rows (the new rows' (run, key) -> id).

    The INSERT takes its rows out of the staging table (DELETE … RETURNING) in the same
    statement, so that it is empty for the next write even inside a caller's transaction
    (where ON COMMIT DELETE ROWS has not run yet), without a TRUNCATE round trip."""
    table = Experience._meta.db_table
    columns = ", ".join(connection.ops.quote_name(str(f.column)) for f in _COPY_FIELDS)
    now = timezone.now()
    with connection.cursor() as cursor:
        session = connection.connection
        if session not in _STAGING_READY:
            cursor.execute(
                f"CREATE TEMP TABLE IF NOT EXISTS experience_in ON COMMIT DELETE ROWS AS "
                f"SELECT {columns} FROM {table} WITH NO DATA"
            )
            # Only once committed: a rolled-back transaction takes the new table with it.
            # A real commit runs this with autocommit back on; a test's captured on-commit
            # callbacks run inside its transaction, which is then rolled back.
            transaction.on_commit(lambda: _STAGING_READY.add(session) if connection.get_autocommit() else None)
        raw = cursor.cursor  # psycopg's own cursor, for COPY
        with raw.copy(f"COPY experience_in ({columns}) FROM STDIN") as copy:
            for draft in drafts:
                copy.write_row(_copy_values(draft, now))
        cursor.execute(
            f"WITH staged AS (DELETE FROM experience_in RETURNING *) "
            f"INSERT INTO {table} ({columns}) SELECT {columns} FROM staged "
            f"ON CONFLICT (run_id, key) DO NOTHING RETURNING id, run_id, key"
        )
        created = {(run_id, key): pk for pk, run_id, key in cursor.fetchall()}
    return created


M = TypeVar("M", bound=models.Model)


def _lock(qs: QuerySet[M]) -> QuerySet[M]:
    # Rows another claimer holds are skipped, not waited for.
    return qs.select_for_update(skip_locked=True, of=("self",))


def batch_claim(
    *,
    run: Run,
    worker: str,
    size: int,
    group_complete: bool = False,
    min_version: int | None = None,
    lease_seconds: float | None = None,
    expert: bool | None = None,
) -> list[Experience]:
    """Lease up to `size` ready experiences of `run` to `worker`, highest priority first.

    group_complete: only whole groups (no member still pending feedback or leased), and
    never part of one; the first group is taken even when it alone exceeds `size`.
    min_version: the staleness bound; nothing made by an older model version is claimed.
    expert: True for expert experiences only, False for the model's own, None for both.
    """
    if size < 1:
        raise ValueError("size must be at least 1")
    now = timezone.now()
    expires = now + timedelta(seconds=lease_seconds if lease_seconds is not None else settings.RFT_LEASE_SECONDS)
    qs = experiences_claimable(run=run, now=now, min_version=min_version, expert=expert)
    if not group_complete and not run.cfg.pipeline.on_claim:
        return _claim_in_one_statement(qs=qs, worker=worker, size=size, expires=expires)
    with transaction.atomic():
        if run.cfg.pipeline.on_claim:
            ids = _claim_through_pipeline(run=run, qs=qs, size=size, group_complete=group_complete)
        elif not group_complete:
            ids = list(_lock(qs.order_by("-priority", "id")).values_list("id", flat=True)[:size])
        else:
            ids = _claim_whole_groups(run=run, qs=qs, size=size)
        if not ids:
            return []
        claimed = _lease_returning(ids=ids, worker=worker, expires=expires)
    # Groups by the id of their first member, not by group_id's text: ids keep the order the
    # experiences were written in, which a rerun of the same seed repeats, while the text
    # order of "attempt-<id>" keys moves with the ids a database hands out (and a batch in
    # another order sums in another order: a run would not reproduce its own curve).
    first: dict[str, int] = {}
    for e in sorted(claimed, key=lambda e: e.id):
        first.setdefault(e.group_id, e.id)
    if group_complete:
        claimed.sort(key=lambda e: (first[e.group_id], e.id))
    else:
        claimed.sort(key=lambda e: (-e.priority, first[e.group_id], e.id))
    return claimed


def _claim_in_one_statement(*, qs: QuerySet[Experience], worker: str, size: int, expires: datetime) -> list[Experience]:
    """Pick, lock and lease in one round trip: the claim is the hot path of every trainer."""
    picked_sql, params = qs.order_by("-priority", "id").values("id")[:size].query.sql_with_params()
    table = Experience._meta.db_table
    sql = (
        f"WITH picked AS ({picked_sql} FOR UPDATE SKIP LOCKED) "
        f"UPDATE {table} SET status = %s, lease_owner = %s, lease_expires_at = %s "
        f"FROM picked WHERE {table}.id = picked.id RETURNING {_returning_columns()}"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [*params, Experience.Status.LEASED, worker, expires])
        rows = cursor.fetchall()
    claimed = [_experience_from_row(row) for row in rows]
    claimed.sort(key=lambda e: (-e.priority, e.id))
    return claimed


def _lease_returning(*, ids: Sequence[int], worker: str, expires: datetime) -> list[Experience]:
    """Lease rows already locked and hand them back from the same statement, not a second
    query through the ORM's slower row building."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {Experience._meta.db_table} SET status = %s, lease_owner = %s, lease_expires_at = %s "
            f"WHERE id = ANY(%s) RETURNING {_returning_columns()}",
            [Experience.Status.LEASED, worker, expires, list(ids)],
        )
        return [_experience_from_row(row) for row in cursor.fetchall()]


_CONCRETE = Experience._meta.concrete_fields
_ATTNAMES = [f.attname for f in _CONCRETE]
_JSON_AT = [i for i, f in enumerate(_CONCRETE) if isinstance(f, models.JSONField)]


def _returning_columns() -> str:
    """Every concrete column, table-qualified, in `_experience_from_row`'s order."""
    table = Experience._meta.db_table
    return ", ".join(f"{table}.{connection.ops.quote_name(str(f.column))}" for f in _CONCRETE)


def _experience_from_row(row: Sequence[object]) -> Experience:
    # What RawQuerySet does, without its per-row column mapping and converter lookups, which
    # cost a third of a 256-row claim. psycopg hands Django jsonb as text (as the ORM decodes it).
    values = list(row)
    for i in _JSON_AT:
        raw = values[i]
        if isinstance(raw, str):
            values[i] = json.loads(raw)
    return Experience.from_db(connection.alias, _ATTNAMES, values)


def _claim_through_pipeline(*, run: Run, qs: QuerySet[Experience], size: int, group_complete: bool) -> list[int]:
    """Select as usual, pass the rows through the run's on_claim operators (which mark the
    rows they remove as filtered, so they leave `qs`), and top up what they removed."""
    kept: list[int] = []
    for _ in range(8):  # a bound on top-ups: a batch smaller than asked beats a long claim
        want = size - len(kept)
        if not group_complete:
            ids = list(_lock(qs.exclude(pk__in=kept).order_by("-priority", "id")).values_list("id", flat=True)[:want])
        else:
            ids = _claim_whole_groups(run=run, qs=qs.exclude(pk__in=kept), size=want, overflow=not kept)
        if not ids:
            break
        rows = list(Experience.objects.filter(pk__in=ids).order_by("-priority", "group_id", "id"))
        passed = pipeline_apply_on_claim(run=run, experiences=rows)
        kept.extend(e.pk for e in passed)
        if len(passed) == len(rows) or len(kept) >= size:
            break
    return kept


def _claim_whole_groups(*, run: Run, qs: QuerySet[Experience], size: int, overflow: bool = True) -> list[int]:
    from django.db.models import Count, Max, Min

    candidates = experiences_in_whole_groups(run=run, qs=qs)
    # Groups in order of their best member, then lock their rows; a group that another
    # claimer holds part of (SKIP LOCKED left rows out) is left alone this time. Ties go to
    # the group written first (its first member's id), not to group_id's text, whose order
    # ("g100" before "g99") moves with the ids a database hands out.
    top = (
        candidates.values("group_id")
        .annotate(best=Max("priority"), n=Count("id"), first=Min("id"))
        .order_by("-best", "first")[: size + 16]
    )
    wanted = {row["group_id"]: row["n"] for row in top}
    if not wanted:
        return []
    locked = list(_lock(qs.filter(group_id__in=list(wanted)).order_by("id")).values_list("id", "group_id"))
    by_group: dict[str, list[int]] = {}
    for pk, group in locked:
        by_group.setdefault(group, []).append(pk)
    ids: list[int] = []
    for group, expected in wanted.items():
        members = by_group.get(group, [])
        if len(members) != expected:
            continue
        if (ids or not overflow) and len(ids) + len(members) > size:
            break
        ids.extend(members)
        if len(ids) >= size:
            break
    return ids


def batch_ack(*, run: Run, worker: str, ids: Sequence[int], step: int | None = None) -> int:
    """Mark leased experiences as trained on: use count + 1, priority decays; with replay
    (max_uses > 1) they go back to ready until used up, else they are consumed. `step`, the
    train step that trained them, is kept as each row's `trained_step` the first time (what
    the label ledger, apps/feedback/ledger.py, says a label reached)."""
    qs, values = _ack_update(run=run, worker=worker, ids=ids, step=step)
    return qs.update(**values)


def _ack_update(
    *, run: Run, worker: str, ids: Sequence[int], step: int | None = None
) -> tuple[QuerySet[Experience], dict[str, object]]:
    """batch_ack's rows and new values, for batch_ack and for batch_commit_step's statement."""
    from django.db.models import Case, When
    from django.db.models.functions import Coalesce

    replay = run.cfg.replay
    again = Q(use_count__lt=replay.max_uses - 1)
    qs = Experience.objects.filter(run=run, pk__in=ids, status=Experience.Status.LEASED, lease_owner=worker)
    return qs, {
        "status": Case(When(again, then=models.Value(Experience.Status.READY)), default=models.Value(Experience.Status.CONSUMED)),
        "priority": Case(When(again, then=F("priority") * replay.priority_decay), default=F("priority")),
        "use_count": F("use_count") + 1,
        **({"trained_step": Coalesce(F("trained_step"), models.Value(step))} if step is not None else {}),
        "last_used_at": timezone.now(),
        "lease_owner": "",
        "lease_expires_at": None,
    }


def batch_commit_step(*, run: Run, step: int, worker: str, ids: Sequence[int], metrics: dict[str, float]) -> str | None:
    """A trainer's step, as it commits: record `step` as the run's last (step - 1 must be),
    ack its batch (every row still leased to `worker`) and store the step's metrics.
    Returns None when done, else why not ("recorded by another trainer", "lease lost"):
    the caller then rolls back its transaction, which this must run inside.

    It is one statement (data-modifying CTEs) instead of three: the in-process loop commits
    a step every ~1 s and each round trip costs 1-5 ms on a loaded host."""

    if not connection.in_atomic_block:
        raise RuntimeError("batch_commit_step runs inside the caller's transaction (a conflict rolls it back)")
    from django.db.models.sql.subqueries import UpdateQuery

    qs, values = _ack_update(run=run, worker=worker, ids=ids, step=step)
    # The ack happens only once the step is recorded, as with the separate statements.
    query = qs.extra(where=["EXISTS (SELECT 1 FROM step)"]).query.chain(UpdateQuery)
    assert isinstance(query, UpdateQuery)
    query.add_update_values(values)
    ack_sql, ack_params = query.get_compiler(connection.alias).as_sql()
    clean = metric_values_clean(metrics)
    quote = connection.ops.quote_name
    runs, metric_table = quote(Run._meta.db_table), quote(Metric._meta.db_table)
    sql = (
        f"WITH step AS (UPDATE {runs} SET train_step = %s WHERE id = %s AND train_step = %s RETURNING id), "
        f"ack AS ({ack_sql} RETURNING 1), "
        f"stored AS (INSERT INTO {metric_table} (run_id, step, name, value, time) "
        f"SELECT %s, %s, m.name, m.value, %s FROM unnest(%s::text[], %s::float8[]) AS m(name, value) "
        f"WHERE EXISTS (SELECT 1 FROM step)) "
        f"SELECT (SELECT count(*) FROM step), (SELECT count(*) FROM ack)"
    )
    params = [step, run.pk, step - 1, *ack_params, run.pk, step, timezone.now(), list(clean), list(clean.values())]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        recorded, acked = cursor.fetchone()
    if not recorded:
        return "recorded by another trainer"
    if acked != len(ids):
        return "lease lost"
    metric_announce(run=run, step=step, values=clean)
    # The labels on the groups it trained are trained now, or late (apps.feedback.ledger).
    labels_changed_publish(run_id=run.pk, why="trained")
    return None


def batch_release(*, run: Run, worker: str, ids: Sequence[int] | None = None) -> int:
    """Hand leased experiences back untouched (all of the worker's when ids is None)."""
    qs = Experience.objects.filter(run=run, status=Experience.Status.LEASED, lease_owner=worker)
    if ids is not None:
        qs = qs.filter(pk__in=ids)
    return qs.update(status=Experience.Status.READY, lease_owner="", lease_expires_at=None)


@dataclass(frozen=True)
class ReapResult:
    experiences: int
    task_attempts: int


def lease_reap(*, now: datetime | None = None) -> ReapResult:
    """Return every expired lease to the pool: experiences to ready, task attempts to queued."""
    now = now or timezone.now()
    experiences = Experience.objects.filter(status=Experience.Status.LEASED, lease_expires_at__lt=now).update(
        status=Experience.Status.READY, lease_owner="", lease_expires_at=None
    )
    attempts = TaskAttempt.objects.filter(status=TaskAttempt.Status.LEASED, lease_expires_at__lt=now).update(
        status=TaskAttempt.Status.QUEUED, lease_owner="", lease_expires_at=None
    )
    return ReapResult(experiences=experiences, task_attempts=attempts)


def task_attempts_create(*, run: Run, epoch: int) -> int:
    """Queue one attempt per unfiltered task of the run's taskset for `epoch` (idempotent)."""
    if run.taskset_id is None:
        return 0
    tasks = Task.objects.filter(taskset_id=run.taskset_id, filter_reason="").values_list("pk", "metadata")
    attempts = [
        TaskAttempt(run=run, task_id=pk, epoch=epoch, priority=float((meta or {}).get("priority", 0.0)))
        for pk, meta in tasks.order_by("index", "pk")
    ]
    if run.cfg.shuffle:
        # Claims take equal priorities in id order, and ids follow this list's order.
        random.Random(f"{run.cfg.seed}:{epoch}").shuffle(attempts)
    TaskAttempt.objects.bulk_create(attempts, batch_size=2000, ignore_conflicts=True)
    task_priorities_refresh(run=run)  # curriculum, when the run's pipeline has one
    return len(attempts)


def task_claim(*, run: Run, worker: str, size: int, lease_seconds: float | None = None) -> list[TaskAttempt]:
    """Lease up to `size` queued task attempts of the run's lowest open epoch to `worker`.

    When the current epoch is used up and the run has epochs left, the next one is queued.
    """
    if size < 1:
        raise ValueError("size must be at least 1")
    expires = timezone.now() + timedelta(seconds=lease_seconds if lease_seconds is not None else settings.RFT_LEASE_SECONDS)
    with transaction.atomic():
        queued = TaskAttempt.objects.filter(run=run, status=TaskAttempt.Status.QUEUED)
        ids = list(_lock(queued.order_by("epoch", "-priority", "id")).values_list("id", flat=True)[:size])
        if not ids:
            last_epoch = TaskAttempt.objects.filter(run=run).order_by("-epoch").values_list("epoch", flat=True).first()
            nxt = 0 if last_epoch is None else last_epoch + 1
            if nxt < run.cfg.epochs and not TaskAttempt.objects.filter(run=run, status=TaskAttempt.Status.LEASED).exists():
                task_attempts_create(run=run, epoch=nxt)
                ids = list(_lock(queued.order_by("epoch", "-priority", "id")).values_list("id", flat=True)[:size])
        if not ids:
            return []
        TaskAttempt.objects.filter(pk__in=ids).update(
            status=TaskAttempt.Status.LEASED, lease_owner=worker, lease_expires_at=expires, tries=F("tries") + 1
        )
    return list(TaskAttempt.objects.filter(pk__in=ids).select_related("task").order_by("epoch", "-priority", "id"))


def task_release(*, run: Run, worker: str, ids: Sequence[int] | None = None) -> int:
    """Hand leased task attempts back to the queue (all of the worker's when ids is None)."""
    qs = TaskAttempt.objects.filter(run=run, status=TaskAttempt.Status.LEASED, lease_owner=worker)
    if ids is not None:
        qs = qs.filter(pk__in=ids)
    return qs.update(status=TaskAttempt.Status.QUEUED, lease_owner="", lease_expires_at=None)


def task_finish(*, run: Run, worker: str, ids: Sequence[int], model_version: int) -> int:
    """Mark the worker's leased attempts done, recording the version that explored them."""
    return TaskAttempt.objects.filter(
        run=run, pk__in=ids, status=TaskAttempt.Status.LEASED, lease_owner=worker
    ).update(
        status=TaskAttempt.Status.DONE, lease_owner="", lease_expires_at=None,
        model_version=model_version, finished_at=timezone.now(),
    )
