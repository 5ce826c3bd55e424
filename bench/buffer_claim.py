"""The cost of one claim-and-ack of 256 experiences, against the floor of the same two
statements sent through raw psycopg, in the same run; then p50 / p99 with as many
concurrent claimers as cores, and the duplicate count; at `--rows` rows (1M by default; run
it again with --rows 10000000 for the 10M point: cost may not grow > 1.5x from 1M).

Targets: Django path / raw floor <= 1.5x; p50 < 10 ms with claimers = cores; 0 duplicates.

The floor: the claim's `WITH picked AS (... FOR UPDATE SKIP LOCKED) UPDATE ... RETURNING`
(the very SQL `batch_claim` sends, built from the same queryset) and the ack's UPDATE (by
hand, with `id = ANY(%s)` where Django sends an IN list), on a psycopg connection in
autocommit, rows left as tuples. What the ratio measures is what rftweb adds: the ORM,
building Experience objects, the transaction handling. The two are measured alternately,
one pair at a time, so load drift on a shared machine hits both alike.

Each concurrent claimer claims and acks back to back with no training step between, so C
claimers and their C Postgres backends keep every core busy; the bench prints the solo cost
x claimers / cores beside the measurement, so a result reads as claim cost or as queueing.

Measured 2026-11-23 (round 9), 1M rows, load 4.0-4.5 (two helper sessions and a bench on the
same 2 cores): claim-and-ack p50 93 ms against the raw floor's 67 ms, ratio of medians 1.38
(per-pair p25/p50/p75 1.30/1.41/1.48; target <= 1.5 met); 2 claimers p50 90 ms (target < 10 ms
not met), 0 duplicates. The picking SELECT alone takes 1.4 ms (an index-only scan of
experience_claim_idx); the floor is the two UPDATEs: status is in three of the table's eight
indexes (the claim index's predicate, experience_group_idx, experience_inflight_idx), so no
update of a claim or an ack is HOT and each of the 256 rows writes a tuple into all eight
indexes, twice. Under 10 ms needs the lease out of the wide experience row (a narrow lease
table the claim inserts into), not a faster client: the raw statements miss it by 6x here.
The 10M point was not re-run.

Round 10 (2026-11-23), this code, 1M rows: claim-and-ack 59.4 ms against the floor's 40.6 ms,
ratio 1.46 (per pair p25/p50/p75 1.21/1.34/1.42), 2 claimers p50 33.7 ms, at load 1.2-1.4;
56.3 / 41.5 ms, ratio 1.36, p50 53.4 ms at load 3.0-3.5; 0 duplicates. EXPLAIN (ANALYZE,
BUFFERS, WAL), 466-byte rows, load 4.9-7.3: the claim 24.5 ms (the picking index scan 0.6 ms;
~2,330 WAL records, 275 KB; 0 of 256 updates HOT, each row a new tuple and entries in six
indexes), the ack 7.5-18.6 ms (~1,800 records, 240 KB, five indexes a row).
Round 13 (2026-11-23), this code, quiet host, 1M then 10M rows in one sitting: claim-and-ack
24.6 ms against the floor's 18.3 ms, ratio 1.34 (per pair p25/p50/p75 1.27/1.32/1.35), 2 claimers
p50 18.5 ms, load 0.3; at 10M (filled in 140 s) 26.4 ms against 20.5 ms, ratio 1.29 (1.19/1.28/
1.38), 2 claimers p50 25.4 ms, load 1.1; 0 duplicates at both. 10M / 1M cost 1.07x (target <=
1.5x met); ratio <= 1.5 met at both; p50 < 10 ms with 2 claimers not met (see above).
Tried and not kept (branch `lease`, round 10): no index reading `status` (a generated column
`claim_state`, leased read as ready, in the claim, group and pending indexes; fillfactor 80)
and a narrow lease table for the reaper, whole-group claims and "in flight". Claims became
HOT (256 of 256; 768 WAL records / 59 KB for the experience rows plus 771 / 50 KB for the
lease rows; EXPLAIN 16.6 ms at load 5.6, ~11 ms of it the HOT updates), but claim-and-ack
wall-clock showed no gain beyond the noise (alternated with this code: 128.6 vs 126.0 ms at
load 7.5, 72.1 vs 54.4 ms at load 2.6-3.4; its 10M point 33.3 ms, p50 29.8 ms at load 3.0),
the ack became two statements, and the stored generated column rewrites the whole table on
migration. The next route: a claim that only inserts lease rows and leaves the wide row
alone (status stays ready; the readers of "leased" -- feedback lateness and revision,
buffer counts, exports -- ask the lease table): about the picking plus 2 ms of lease rows.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import time
from typing import Any

from bench.common import median, percentile, setup_django


def _claimer(run_id: int, worker: str, size: int, claims: int, out: mp.Queue[tuple[str, list[float], list[int]]]) -> None:
    setup_django(migrate=False)
    from apps.buffer.services import batch_ack, batch_claim
    from apps.runs.models import Run

    run = Run.objects.get(pk=run_id)
    latencies: list[float] = []
    ids: list[int] = []
    for _ in range(claims):
        t0 = time.perf_counter()
        batch = batch_claim(run=run, worker=worker, size=size)
        latencies.append(time.perf_counter() - t0)
        if not batch:
            break
        got = [e.pk for e in batch]
        ids.extend(got)
        batch_ack(run=run, worker=worker, ids=got)
    out.put((worker, latencies, ids))


def _fill(run_id: int, rows: int) -> None:
    from django.db import connection

    from apps.buffer.models import Experience

    table = Experience._meta.db_table
    tokens = json.dumps(list(range(16)))
    logprobs = json.dumps([-0.5] * 8)
    with connection.cursor() as cur:
        cur.execute(
            f"""INSERT INTO {table} (run_id, key, group_id, source, prompt_text, response_text, messages, token_ids,
                prompt_length, logprobs, action_mask, finish_reason, reward, reward_parts, model_version, is_expert,
                status, filter_reason, priority, use_count, lease_owner, metadata, created_at)
            SELECT %s, 'k' || g, 'g' || (g / 8), 'explorer', 'prompt', 'response', NULL, %s::jsonb, 8, %s::jsonb,
                NULL, 'stop', 1.0, '{{}}'::jsonb, 0, false, 'ready', '', (g %% 97)::float, 0, '', '{{}}'::jsonb, now()
            FROM generate_series(1, %s) AS g""",
            [run_id, tokens, logprobs, rows],
        )
        cur.execute(f"ANALYZE {table}")


def _floor_statements(run: Any, size: int) -> tuple[str, list[Any], str]:
    """The claim SQL `batch_claim` sends (same queryset, same RETURNING list) and the ack."""
    from django.utils import timezone

    from apps.buffer.models import Experience
    from apps.buffer.selectors import experiences_claimable
    from apps.buffer.services import _returning_columns

    table = Experience._meta.db_table
    qs = experiences_claimable(run=run, now=timezone.now())
    picked_sql, params = qs.order_by("-priority", "id").values("id")[:size].query.sql_with_params()
    claim = (
        f"WITH picked AS ({picked_sql} FOR UPDATE SKIP LOCKED) "
        f"UPDATE {table} SET status = %s, lease_owner = %s, lease_expires_at = %s "
        f"FROM picked WHERE {table}.id = picked.id RETURNING {_returning_columns()}"
    )
    decay = run.cfg.replay.priority_decay
    again = run.cfg.replay.max_uses - 1
    ack = (
        f"UPDATE {table} SET status = CASE WHEN use_count < {again} THEN 'ready' ELSE 'consumed' END, "
        f"priority = CASE WHEN use_count < {again} THEN priority * {decay} ELSE priority END, "
        "use_count = use_count + 1, last_used_at = %s, lease_owner = '', lease_expires_at = NULL "
        "WHERE run_id = %s AND id = ANY(%s) AND status = 'leased' AND lease_owner = %s"
    )
    return claim, list(params), ack


def _solo_costs(run: Any, size: int, pairs: int, database_url: str) -> tuple[list[float], list[float], list[int]]:
    """Alternating claim-and-ack cycles: (rftweb's seconds, the raw floor's seconds, ids)."""
    from datetime import timedelta

    import psycopg
    from django.utils import timezone

    from apps.buffer.services import batch_ack, batch_claim

    claim, params, ack = _floor_statements(run, size)
    django_s: list[float] = []
    floor_s: list[float] = []
    ids: list[int] = []
    with psycopg.connect(database_url, autocommit=True) as conn:
        for i in range(pairs + 1):
            t0 = time.perf_counter()
            batch = batch_claim(run=run, worker="solo-django", size=size)
            got = [e.pk for e in batch]
            batch_ack(run=run, worker="solo-django", ids=got)
            t1 = time.perf_counter()
            now = timezone.now()
            rows = conn.execute(claim, [*params, "leased", "solo-raw", now + timedelta(seconds=300)]).fetchall()
            raw_ids = [r[0] for r in rows]
            conn.execute(ack, [now, run.pk, raw_ids, "solo-raw"])
            t2 = time.perf_counter()
            if i:  # the first pair warms both connections
                django_s.append(t1 - t0)
                floor_s.append(t2 - t1)
            ids += got + raw_ids
    return django_s, floor_s, ids


def _measure(run_id: int, claimers: int, size: int, claims: int) -> tuple[list[float], list[int]]:
    ctx = mp.get_context("spawn")
    out: mp.Queue[tuple[str, list[float], list[int]]] = ctx.Queue()
    procs = [ctx.Process(target=_claimer, args=(run_id, f"w{i}", size, claims, out)) for i in range(claimers)]
    for p in procs:
        p.start()
    results = [out.get(timeout=600) for _ in procs]
    for p in procs:
        p.join()
    latencies = [x for _, lat, _ in results for x in lat[1:]]  # the first claim warms the connection
    ids = [pk for _, _, got in results for pk in got]
    return latencies, ids


def _load() -> str:
    return "load " + "/".join(f"{x:.1f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--claimers", type=int, default=os.cpu_count() or 1, help="concurrent claimers (default: cores)")
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--claims", type=int, default=60, help="claims per claimer, and solo pairs")
    args = parser.parse_args()
    setup_django()
    from django.contrib.auth.models import User
    from django.db import connection

    from apps.buffer.models import Experience
    from apps.runs.services import run_create
    from bench.common import BENCH_DB

    owner, _ = User.objects.get_or_create(username="bench")
    run = run_create(name="bench-claim", owner=owner, config={"model": "bench-org/no-such-model", "rewards": [{"name": "exact_match"}]})
    t0 = time.perf_counter()
    _fill(run.pk, args.rows)
    print(f"filled {args.rows:,} rows in {time.perf_counter() - t0:.1f} s ({_load()})", flush=True)
    try:
        django_s, floor_s, solo_ids = _solo_costs(run, args.size, args.claims, BENCH_DB)
        solo_load = _load()
        many, ids = _measure(run.pk, args.claimers, args.size, args.claims)
        many_load = _load()
        all_ids = solo_ids + ids
        duplicates = len(all_ids) - len(set(all_ids))
        cost, floor = median(django_s), median(floor_s)
        ratios = sorted(d / f for d, f in zip(django_s, floor_s))
        cores = os.cpu_count() or 1
        print(f"rows {args.rows:,}, claim-and-ack of {args.size}, {len(django_s)} alternating pairs ({solo_load}):")
        print(f"  rftweb (batch_claim + batch_ack): p50 {cost * 1000:.2f} ms, p99 {percentile(django_s, 0.99) * 1000:.2f} ms")
        print(f"  raw psycopg floor (same statements): p50 {floor * 1000:.2f} ms, p99 {percentile(floor_s, 0.99) * 1000:.2f} ms")
        print(f"  ratio of medians {cost / floor:.2f}; per-pair ratio p25/p50/p75 "
              f"{percentile(ratios, 0.25):.2f}/{percentile(ratios, 0.5):.2f}/{percentile(ratios, 0.75):.2f}")
        print(f"{args.claimers} concurrent claimers ({many_load}): claim p50 {median(many) * 1000:.2f} ms, "
              f"p99 {percentile(many, 0.99) * 1000:.2f} ms ({len(many)} claims, {len(ids):,} experiences); "
              f"queueing bound solo claim-and-ack x {args.claimers}/{cores} = "
              f"{cost * args.claimers / min(cores, args.claimers) * 1000:.2f} ms")
        print(f"duplicates: {duplicates}")
        print(f"rows {args.rows:,}: cost ratio {cost / floor:.2f} (target <= 1.5), claim-and-ack {cost * 1000:.2f} ms; "
              f"p50 with {args.claimers} claimers {median(many) * 1000:.2f} ms (target < 10 ms); "
              f"duplicates {duplicates} (target 0); {many_load}")
    finally:
        with connection.cursor() as cur:
            cur.execute(f"DELETE FROM {Experience._meta.db_table} WHERE run_id = %s", [run.pk])
        run.delete()


if __name__ == "__main__":
    main()
