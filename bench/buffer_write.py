"""experiences/s of experience_write against raw psycopg COPY of the same rows, same run.

Target: ratio ≥ 0.5. Prints the ratio on the last line.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from bench.common import setup_django


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=20000)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--response-tokens", type=int, default=64)
    args = parser.parse_args()
    setup_django()

    from django.contrib.auth.models import User
    from django.db import connection

    from apps.buffer.drafts import ExperienceDraft
    from apps.buffer.models import Experience
    from apps.buffer.services import experience_write
    from apps.runs.services import run_create

    owner, _ = User.objects.get_or_create(username="bench")
    run = run_create(name="bench-write", owner=owner, config={"model": "bench-org/no-such-model", "rewards": [{"name": "exact_match"}]})
    prompt, response = 48, args.response_tokens

    def values(prefix: str, i: int) -> dict[str, Any]:
        return {
            "run_id": run.pk, "key": f"{prefix}-{i}", "group_id": f"{prefix}-g{i // 8}",
            "prompt_text": "What is 12 + 7? Answer inside tags.", "response_text": "<answer>19</answer>" * 4,
            "token_ids": list(range(prompt + response)), "prompt_length": prompt,
            "logprobs": [-0.25] * response, "reward": 1.0, "reward_parts": {"math_accuracy": 1.0},
            "model_version": 0,
        }

    def row(prefix: str, i: int) -> ExperienceDraft:
        # Built inside the timed loop: a producer pays for the draft's checks (they were
        # experience_write's own before the draft type); the raw COPY below does not.
        return ExperienceDraft(**values(prefix, i))

    # Warm up connections and caches.
    experience_write(experiences=[row("warm", i) for i in range(args.batch)])

    t0 = time.perf_counter()
    for start in range(0, args.rows, args.batch):
        experience_write(experiences=[row("ours", i) for i in range(start, min(start + args.batch, args.rows))])
    ours = args.rows / (time.perf_counter() - t0)

    columns = ["run_id", "key", "group_id", "source", "prompt_text", "response_text", "token_ids", "prompt_length",
               "logprobs", "finish_reason", "reward", "reward_parts", "model_version", "is_expert", "status",
               "filter_reason", "priority", "use_count", "lease_owner", "metadata", "created_at"]
    table = Experience._meta.db_table
    raw = connection.connection  # the psycopg connection under Django's
    t0 = time.perf_counter()
    for start in range(0, args.rows, args.batch):
        with raw.cursor() as cur:
            with cur.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN") as copy:
                for i in range(start, min(start + args.batch, args.rows)):
                    r = values("copy", i)
                    copy.write_row((
                        r["run_id"], r["key"], r["group_id"], "explorer", r["prompt_text"], r["response_text"],
                        json.dumps(r["token_ids"]), r["prompt_length"], json.dumps(r["logprobs"]), "", r["reward"],
                        json.dumps(r["reward_parts"]), 0, False, "ready", "", 0.0, 0, "", "{}", "now",
                    ))
        raw.commit()
    copy_rate = args.rows / (time.perf_counter() - t0)

    assert Experience.objects.filter(run=run).count() == 2 * args.rows + args.batch
    Experience.objects.filter(run=run).delete()
    run.delete()
    print(f"experience_write: {ours:,.0f} experiences/s ({args.rows} rows, batches of {args.batch})")
    print(f"raw COPY:         {copy_rate:,.0f} experiences/s")
    print(f"ratio experience_write / COPY = {ours / copy_rate:.2f} (target >= 0.5)")


if __name__ == "__main__":
    main()
