"""Write throughput through the default experience pipeline vs `experience_write` alone.

    python -m bench.pipeline [--batches 20] [--batch-groups 16] [--rounds 5]

Two runs in one database: one with no pipeline, one with `DEFAULT_ON_WRITE` (clean,
reward_invalid, length_bounds, dedup_exact across the run, reward_variance,
priority_reward_variance). Rounds alternate between them so machine noise hits both.
Rows look like explorer output: 4 completions per prompt, ~40 prompt and ~200 response
tokens with logprobs, text with stray whitespace, a quarter of the groups all-equal.
Target: pipeline / plain >= 0.7. The last line prints the ratio.

Needs DATABASE_URL (Postgres) and REDIS_URL; makes and drops its own database
(TEST_DATABASE_NAME, default test_bench_pipeline).
"""

from __future__ import annotations

import argparse
import itertools
import os
import random
import time
from typing import Any

TARGET = 0.7
_seq = itertools.count()


def _rows(run_id: int, groups: int, rng: random.Random) -> list[Any]:
    from apps.buffer.drafts import ExperienceDraft

    rows = []
    for _ in range(groups):
        g = f"g{next(_seq)}"
        flat = rng.random() < 0.25
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        for i in range(4):
            plen, rlen = 40, rng.randint(150, 250)
            reward = 1.0 if flat else float(rng.random() < 0.5)
            rows.append(ExperienceDraft.from_row({
                "run_id": run_id, "key": f"{g}-{i}", "group_id": g,
                "prompt_text": f"What is {a} + {b}?  Show your work.\n",
                "response_text": f"Let me add {a} and {b}.  \n\n\n\nFirst the ones, then the tens. " * 4
                                 + f"<answer>{a + b + rng.randint(0, 1)}</answer>  ",
                "token_ids": [rng.randrange(300) for _ in range(plen + rlen)], "prompt_length": plen,
                "logprobs": [-rng.random() for _ in range(rlen)], "finish_reason": "stop" if rng.random() < 0.9 else "length",
                "reward": reward, "auto_reward": reward, "reward_parts": {"accuracy": reward}, "model_version": 0,
            }))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", type=int, default=20, help="write batches per run per round")
    parser.add_argument("--batch-groups", type=int, default=16, help="groups of 4 per write batch")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "rftweb.settings")
    os.environ.setdefault("TEST_DATABASE_NAME", "test_bench_pipeline")
    import django

    django.setup()
    from django.db import connection

    connection.creation.create_test_db(verbosity=0, autoclobber=True, keepdb=False)
    try:
        _bench(args)
    finally:
        connection.creation.destroy_test_db(connection.settings_dict["NAME"], verbosity=0)


def _bench(args: argparse.Namespace) -> None:
    from django.contrib.auth.models import User

    from apps.buffer.models import Experience
    from apps.buffer.pipeline import DEFAULT_ON_WRITE, pipeline_metrics_flush
    from apps.buffer.services import experience_write
    from apps.runs.services import run_create

    owner = User.objects.create_user("bench")
    base = {"model": "local/demo", "algorithm": "grpo", "repeat_times": 4}
    plain = run_create(name="plain", owner=owner, config=base)
    piped = run_create(name="piped", owner=owner, config={**base, "pipeline": {"on_write": DEFAULT_ON_WRITE}})
    rng = random.Random(0)
    # Rows made up front: the bench measures the write, not the generation of test data.
    batches = {
        run.pk: [[_rows(run.pk, args.batch_groups, rng) for _ in range(args.batches)] for _ in range(args.rounds)]
        for run in (plain, piped)
    }
    # Warm-up: connections (database, channel layer), config caches, first-insert costs.
    for run in (plain, piped):
        experience_write(experiences=_rows(run.pk, 2, rng))
    pipeline_metrics_flush()
    seconds = {plain.pk: 0.0, piped.pk: 0.0}
    for r in range(args.rounds):
        order = (plain, piped) if r % 2 == 0 else (piped, plain)
        for run in order:
            start = time.perf_counter()
            for batch in batches[run.pk][r]:
                experience_write(experiences=batch)
            seconds[run.pk] += time.perf_counter() - start
    pipeline_metrics_flush()
    n = args.rounds * args.batches * args.batch_groups * 4
    plain_rate, piped_rate = n / seconds[plain.pk], n / seconds[piped.pk]
    filtered = Experience.objects.filter(run=piped, status="filtered").count()
    print(f"rows per run: {n} in batches of {args.batch_groups * 4}")
    print(f"experience_write alone:      {plain_rate:8.0f} experiences/s")
    print(f"default pipeline + write:    {piped_rate:8.0f} experiences/s ({filtered} filtered)")
    print(f"target >= {TARGET}x")
    print(f"ratio {piped_rate / plain_rate:.3f}")


if __name__ == "__main__":
    main()
