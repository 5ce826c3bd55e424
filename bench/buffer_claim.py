"""p50 / p99 latency of 256-experience claims from a 1M-row table with 8 concurrent
claimers, and the duplicate count. Target: p50 < 10 ms, 0 duplicates.

The baseline in the same run is one claimer alone: the last line prints p50 under
contention against it, with the duplicate count.

Each claimer claims and acks back to back, with no training step in between, so 8 claimers
and their 8 Postgres backends keep every core busy: on C cores a claim then waits for about
8 / C others, and p50 under contention is bounded below by the solo p50 × 8 / C. The bench
prints that bound beside the measurement, so a result reads as claim cost or as queueing.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import time

from bench.common import median, percentile, setup_django


def _claimer(run_id: int, worker: str, size: int, claims: int, out: "mp.Queue[tuple[str, list[float], list[int]]]") -> None:
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


def _measure(run_id: int, claimers: int, size: int, claims: int) -> tuple[list[float], list[int]]:
    ctx = mp.get_context("spawn")
    out: mp.Queue = ctx.Queue()
    procs = [ctx.Process(target=_claimer, args=(run_id, f"w{i}", size, claims, out)) for i in range(claimers)]
    for p in procs:
        p.start()
    results = [out.get(timeout=600) for _ in procs]
    for p in procs:
        p.join()
    latencies = [x for _, lat, _ in results for x in lat[1:]]  # the first claim warms the connection
    ids = [pk for _, _, got in results for pk in got]
    return latencies, ids


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--claimers", type=int, default=8)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--claims", type=int, default=60, help="claims per claimer")
    args = parser.parse_args()
    setup_django()
    from django.contrib.auth.models import User
    from django.db import connection

    from apps.buffer.models import Experience
    from apps.runs.services import run_create

    owner, _ = User.objects.get_or_create(username="bench")
    run = run_create(name="bench-claim", owner=owner, config={"model": "bench", "rewards": [{"name": "exact_match"}]})
    t0 = time.perf_counter()
    _fill(run.pk, args.rows)
    print(f"filled {args.rows:,} rows in {time.perf_counter() - t0:.1f} s")
    try:
        solo, solo_ids = _measure(run.pk, 1, args.size, args.claims)
        many, ids = _measure(run.pk, args.claimers, args.size, args.claims)
        all_ids = solo_ids + ids
        duplicates = len(all_ids) - len(set(all_ids))
        print(f"1 claimer:  p50 {median(solo) * 1000:.2f} ms, p99 {percentile(solo, 0.99) * 1000:.2f} ms ({len(solo)} claims)")
        print(f"{args.claimers} claimers: p50 {median(many) * 1000:.2f} ms, p99 {percentile(many, 0.99) * 1000:.2f} ms "
              f"({len(many)} claims, {len(ids):,} experiences)")
        cores = os.cpu_count() or 1
        print(f"CPU bound at {cores} cores: solo p50 x {args.claimers} / {cores} = "
              f"{median(solo) * args.claimers / min(cores, args.claimers) * 1000:.2f} ms")
        print(f"duplicates: {duplicates}")
        print(f"ratio p50 {args.claimers} claimers / 1 claimer = {median(many) / median(solo):.2f}; "
              f"p50 {median(many) * 1000:.2f} ms (target < 10 ms), duplicates {duplicates} (target 0)")
    finally:
        with connection.cursor() as cur:
            cur.execute(f"DELETE FROM {Experience._meta.db_table} WHERE run_id = %s", [run.pk])
        run.delete()


if __name__ == "__main__":
    main()
