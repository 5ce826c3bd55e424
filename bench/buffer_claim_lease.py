"""Prototype, raw psycopg: a claim that writes no wide row, against today's claim, same run,
alternated. Issue #22 item 4.

Today's claim (bench/buffer_claim.py's floor) updates 256 wide experience rows ready ->
leased: no update is HOT (status is in three indexes), so each row writes a new tuple and
entries in every index. The prototype's claim leaves the experience row alone: it locks the
picked rows (`FOR UPDATE SKIP LOCKED`: a lock bit in the tuple header, no new tuple, no
index entry) and inserts narrow lease rows (experience id as the key, run, owner, expiry)
into a small table; rows with a lease are left out of the picking by an anti-join. The
lease table's key on the experience id is what makes two claimers never hold one row: one
whose statement began before the other committed can still pick a row the other just
leased (its snapshot does not see the lease, the row lock is gone), and its insert then
does nothing for that row (ON CONFLICT DO NOTHING), so it is not handed back. The ack is
one wide update (ready or consumed) joined to the DELETE of the leases.

Measured: solo claim, ack and claim-and-ack of each, alternated one pair at a time; then
`--claimers` concurrent claimers (claim and ack back to back), phases alternated old / new
`--rounds` times; duplicates over everything; load average beside each figure.

Measured 2026-11-23 (round 11), 1M rows, 2 claimers (= cores), the host shared with two
other sessions. "old" is today's claim, "new" the prototype; claim p50 in ms.
  run   load     solo claim old/new (per-pair new/old p25/p50/p75)  solo claim-and-ack old/new
  1     1.9-2.1  18.1 / 11.8 (0.61/0.67/0.74)                       28.5 / 21.1
  2     3.2-3.4  38.3 / 28.6 (0.71/0.79/0.85)                       51.3 / 43.0
  3     3.8-3.9  16.6 / 11.1 (0.60/0.67/0.70)                       27.5 / 19.9
  4     4.7-5.3  25.8 / 17.4 (0.62/0.71/0.80)                       37.7 / 30.9
  2 claimers, phases alternated old/new (p50 old -> new):
  run 1: 37.8 -> 17.9, 19.8 -> 17.4; run 2: 47.1 -> 32.8 (then the deadlock below);
  run 3: 44.7 -> 26.0, 28.9 -> 33.9, 31.9 -> 25.1; run 4: 48.3 -> 36.2, 37.7 -> 31.0, 29.0 -> 22.4.
Lower in 8 of 9 alternated phases; 0 duplicates of 80-113k claimed rows per run. New
claims needing a top-up statement: 6-19 of 60 a phase (1 still short after two top-ups).
EXPLAIN (ANALYZE, BUFFERS, WAL) at load 3.8: old claim 22.5 ms (2,311 WAL records, 272 KB),
new claim 3.8 ms (1,282 records, 81 KB: 256 row-lock records and the lease rows); old ack
13.5 ms, new ack 9.0 ms. The wall-clock claim keeps ~7 ms over the EXPLAIN: sending and
decoding 256 wide rows in Python, the same for both, so < 10 ms with 2 claimers on 2 busy
cores stays out of reach either way.
Run 2 ended in a deadlock with the ack written DELETE-the-leases-then-UPDATE: a claimer
whose stale snapshot picked a row being acked held its lock and waited on the lease's
deletion, while the ack waited on the row. The ack now updates the row first (see
`new_ack`); runs 3 and 4 had none.

The same design was then built into the app on a branch (round 11, not merged): an
`ExperienceLease` model keyed by experience (no database foreign keys), a migration moving
stored leases into it and dropping `lease_owner` / `lease_expires_at`, the claim as one
statement (lock, insert leases ON CONFLICT DO NOTHING, top up at most twice), whole-group
claims handing back a group that lost a member, the ack as a hand-written UPDATE ... FROM the
lease table (the ORM's EXISTS let the planner scan every lease per row: 28 -> 17 ms at 100k
rows), release and the reaper as lease deletes, and every reader of "leased" (run page, API and
runs-list counts, the browser, in-flight, feedback lateness and hand-out, revision, scoring,
exports) asking the lease table. bench/buffer_claim against the round-10 code, fresh databases,
one after the other (the two schemas cannot share one): claim-and-ack 58.5 / 60.3 / 78.9 ms
old against 50.0 / 96.7 / 43.1 new, 2-claimer p50 46.8 / 62.0 / 68.2 against 36.6 / 79.8 / 43.9,
load 2.4-5.8: lower in 2 of 3 pairs, the load swamping the difference; 0 duplicates. Not merged:
a schema change of that reach needs a gain the app shows, measured on a quiet host (alternating
the two schemas means two databases); the prototype's 0.67-0.79x claim is where to start.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import time
from datetime import datetime, timedelta, timezone
from typing import Any

from bench.common import BENCH_DB, median, percentile, setup_django

LEASE = "bench_experience_lease"
TOPUPS = [0]  # top-up statements this process sent


def _load() -> str:
    return "load " + "/".join(f"{x:.1f}" for x in os.getloadavg())


def _statements(table: str, columns: str, size: int, decay: float, again: int) -> dict[str, str]:
    pick = (
        f"SELECT e.id FROM {table} e WHERE e.run_id = %(run)s AND e.status = 'ready' {{extra}} "
        f"ORDER BY e.priority DESC, e.id LIMIT {size} FOR UPDATE OF e SKIP LOCKED"
    )
    settle = (
        f"status = CASE WHEN use_count < {again} THEN 'ready' ELSE 'consumed' END, "
        f"priority = CASE WHEN use_count < {again} THEN priority * {decay} ELSE priority END, "
        "use_count = use_count + 1, last_used_at = %(now)s"
    )
    return {
        "old_claim": (
            f"WITH picked AS ({pick.format(extra='')}) "
            f"UPDATE {table} SET status = 'leased', lease_owner = %(owner)s, lease_expires_at = %(expires)s "
            f"FROM picked WHERE {table}.id = picked.id RETURNING {columns}"
        ),
        "old_ack": (
            f"UPDATE {table} SET {settle}, lease_owner = '', lease_expires_at = NULL "
            f"WHERE run_id = %(run)s AND id = ANY(%(ids)s) AND status = 'leased' AND lease_owner = %(owner)s"
        ),
        "new_claim": (
            "WITH picked AS ("
            + pick.format(extra=f"AND NOT EXISTS (SELECT 1 FROM {LEASE} l WHERE l.experience_id = e.id)")
            + f"), leased AS (INSERT INTO {LEASE} (experience_id, run_id, owner, expires_at) "
            f"SELECT id, %(run)s, %(owner)s, %(expires)s FROM picked ON CONFLICT DO NOTHING RETURNING experience_id) "
            f"SELECT {columns} FROM {table} JOIN leased ON {table}.id = leased.experience_id"
        ),
        # The wide row first, then its lease: a claimer whose stale snapshot picked a row
        # the ack is settling must find that row locked (and skip it), never hold the row
        # while waiting on the lease's deletion (the ack would then wait on the row: a
        # deadlock, seen with DELETE ... then UPDATE).
        "new_ack": (
            f"WITH settled AS (UPDATE {table} SET {settle} FROM {LEASE} l WHERE l.experience_id = ANY(%(ids)s) "
            f"AND l.owner = %(owner)s AND {table}.id = l.experience_id RETURNING {table}.id) "
            f"DELETE FROM {LEASE} USING settled WHERE {LEASE}.experience_id = settled.id"
        ),
    }


def _cycle(conn: Any, st: dict[str, str], kind: str, run: int, owner: str, size: int = 256, topup: int = 0) -> tuple[float, float, list[int]]:
    now = datetime.now(timezone.utc)
    args = {"run": run, "owner": owner, "expires": now + timedelta(seconds=300), "now": now}
    t0 = time.perf_counter()
    ids = [r[0] for r in conn.execute(st[f"{kind}_claim"], args).fetchall()]
    if kind == "new" and topup:
        # A statement whose snapshot predates another claimer's commit can pick rows that
        # claimer leased; their inserts do nothing. One more statement (a fresh snapshot)
        # tops the batch up, as the app would have to.
        for _ in range(topup):
            if len(ids) >= size:
                break
            more = conn.execute(st["new_claim"].replace(f"LIMIT {size}", f"LIMIT {size - len(ids)}"), args).fetchall()
            if not more:
                break
            ids += [r[0] for r in more]
            TOPUPS[0] += 1
    t1 = time.perf_counter()
    conn.execute(st[f"{kind}_ack"], {**args, "ids": ids})
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1, ids


def _claimer(url: str, st: dict[str, str], run: int, owner: str, claims: int, rounds: int,
             barrier: Any, out: Any, size: int, topup: int) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        _cycle(conn, st, "old", run, owner)  # warm the connection
        for r in range(rounds):
            for kind in ("old", "new"):
                barrier.wait()
                lat, ids, short = [], [], 0
                for _ in range(claims):
                    c, _a, got = _cycle(conn, st, kind, run, owner, size, topup)
                    lat.append(c)
                    ids += got
                    short += len(got) < size
                out.put((r, kind, owner, lat, ids, short, TOPUPS[0]))
                TOPUPS[0] = 0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--claimers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--pairs", type=int, default=40, help="solo alternated pairs")
    parser.add_argument("--claims", type=int, default=30, help="claims per claimer per phase")
    parser.add_argument("--rounds", type=int, default=2, help="old/new phase pairs with concurrent claimers")
    parser.add_argument("--topup", type=int, default=2, help="extra statements a short new claim may send")
    parser.add_argument("--explain", action="store_true")
    args = parser.parse_args()
    setup_django()
    import psycopg
    from django.contrib.auth.models import User
    from django.db import connection

    from apps.buffer.models import Experience
    from apps.runs.services import run_create
    from bench.buffer_claim import _fill

    table = Experience._meta.db_table
    columns = ", ".join(f"{table}.{connection.ops.quote_name(str(f.column))}" for f in Experience._meta.concrete_fields)
    owner, _ = User.objects.get_or_create(username="bench")
    run = run_create(name="bench-claim-lease", owner=owner, config={"model": "bench-org/no-such-model", "rewards": [{"name": "exact_match"}]})
    st = _statements(table, columns, args.size, run.cfg.replay.priority_decay, run.cfg.replay.max_uses - 1)
    with connection.cursor() as cur:
        cur.execute(f"DROP TABLE IF EXISTS {LEASE}")
        cur.execute(f"CREATE TABLE {LEASE} (experience_id bigint PRIMARY KEY, run_id bigint NOT NULL, "
                    f"owner varchar(200) NOT NULL, expires_at timestamptz NOT NULL)")
        cur.execute(f"CREATE INDEX {LEASE}_run ON {LEASE} (run_id)")
    t0 = time.perf_counter()
    _fill(run.pk, args.rows)
    print(f"filled {args.rows:,} rows in {time.perf_counter() - t0:.1f} s ({_load()})", flush=True)
    every: list[int] = []
    try:
        with psycopg.connect(BENCH_DB, autocommit=True) as conn:
            if args.explain:
                for kind in ("old", "new"):
                    now = datetime.now(timezone.utc)
                    a = {"run": run.pk, "owner": "explain", "expires": now + timedelta(seconds=300), "now": now}
                    conn.execute("BEGIN")
                    plan = conn.execute("EXPLAIN (ANALYZE, BUFFERS, WAL) " + st[f"{kind}_claim"], a).fetchall()
                    print(f"--- {kind} claim ({_load()})")
                    print("\n".join(r[0] for r in plan))
                    got = [r[0] for r in conn.execute(st[f"{kind}_claim"], {**a, "run": run.pk}).fetchall()]
                    plan = conn.execute("EXPLAIN (ANALYZE, BUFFERS, WAL) " + st[f"{kind}_ack"], {**a, "ids": got}).fetchall()
                    conn.execute("ROLLBACK")
                    print(f"--- {kind} ack of {len(got)} ({_load()})")
                    print("\n".join(r[0] for r in plan))
            res: dict[str, dict[str, list[float]]] = {k: {"claim": [], "ack": [], "both": []} for k in ("old", "new")}
            for i in range(args.pairs + 1):
                for kind in ("old", "new") if i % 2 else ("new", "old"):
                    c, ack_s, ids = _cycle(conn, st, kind, run.pk, f"solo-{kind}", args.size, args.topup)
                    every += ids
                    if i:
                        res[kind]["claim"].append(c)
                        res[kind]["ack"].append(ack_s)
                        res[kind]["both"].append(c + ack_s)
            print(f"solo, {args.pairs} alternated pairs of claim-and-ack of {args.size} ({_load()}):")
            for kind, r in res.items():
                print(f"  {kind}: claim p50 {median(r['claim']) * 1e3:.2f} ms (p25/p75 {percentile(r['claim'], .25) * 1e3:.2f}/"
                      f"{percentile(r['claim'], .75) * 1e3:.2f}), ack p50 {median(r['ack']) * 1e3:.2f} ms, "
                      f"claim-and-ack p50 {median(r['both']) * 1e3:.2f} ms (p25/p75 {percentile(r['both'], .25) * 1e3:.2f}/"
                      f"{percentile(r['both'], .75) * 1e3:.2f})")
            ratios = sorted(n / o for n, o in zip(res["new"]["claim"], res["old"]["claim"]))
            print(f"  new/old claim per pair p25/p50/p75 {percentile(ratios, .25):.2f}/{percentile(ratios, .5):.2f}/"
                  f"{percentile(ratios, .75):.2f}", flush=True)
        ctx = mp.get_context("spawn")
        out = ctx.Queue()
        barrier = ctx.Barrier(args.claimers)
        procs = [ctx.Process(target=_claimer, args=(BENCH_DB, st, run.pk, f"w{i}", args.claims, args.rounds, barrier, out,
                                                         args.size, args.topup))
                 for i in range(args.claimers)]
        for p in procs:
            p.start()
        phases: dict[tuple[int, str], list[Any]] = {}
        topups_by: dict[tuple[int, str], int] = {}
        for _ in range(args.rounds * 2 * args.claimers):
            r, kind, who, lat, ids, short, topups = out.get(timeout=900)
            phases.setdefault((r, kind), []).append((lat, ids, short))
            topups_by[(r, kind)] = topups_by.get((r, kind), 0) + topups
            if len(phases[(r, kind)]) == args.claimers:
                lats = [x for lat_, _, _ in phases[(r, kind)] for x in lat_]
                got = [pk for _, ids_, _ in phases[(r, kind)] for pk in ids_]
                every += got
                shorts = sum(s for _, _, s in phases[(r, kind)])
                print(f"round {r} {kind}: {args.claimers} claimers, claim p50 {median(lats) * 1e3:.2f} ms "
                      f"p25/p75 {percentile(lats, .25) * 1e3:.2f}/{percentile(lats, .75) * 1e3:.2f} "
                      f"p99 {percentile(lats, .99) * 1e3:.2f} ms ({len(lats)} claims, {topups_by[(r, kind)]} top-ups, {shorts} short, "
                      f"duplicates in phase {len(got) - len(set(got))}) ({_load()})", flush=True)
        for p in procs:
            p.join()
        print(f"duplicates over all: {len(every) - len(set(every))} of {len(every):,} ({_load()})")
    finally:
        with connection.cursor() as cur:
            cur.execute(f"DROP TABLE IF EXISTS {LEASE}")
            cur.execute(f"DELETE FROM {table} WHERE run_id = %s", [run.pk])
        run.delete()


if __name__ == "__main__":
    main()
