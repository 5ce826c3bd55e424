"""From the label that completes a retraining batch to a new reward-model version scoring
experiences (issue #31: at most 60 s on this machine), through the real path: the rating
service (what the annotation page and the API call) commits the label, its commit enqueues
`reward_model_train` on the `reward` queue (apps/feedback/signals.py), a real Celery worker
trains the run's reward model (`--kind`, default `head`, over the demo model: the run's own
base), publishes the version and scores the open experiences nobody rated. The clock starts
when the label's transaction has committed and stops when the first score of the new version
is in the database.

Each round rates `--every` completions (half 5, half 1, by a fixed rule the reward model can
learn: answers with the word "certainly"), so each round's last label makes a version due.

    python -m bench rm_latency [--rounds 5] [--every 20] [--open 64] [--kind head]

The last line: the median and the worst seconds over the rounds, with the load average.

Measured 2026-11-25 (head over the demo model, 20 labels a version, 64 open experiences):
19.7 / 26.8 / 33.0 s (median 26.8, worst 33.0) at load 29-37. Before the reward worker imported
torch and transformers at start, the first round took 147.8 s (then 34.7 and 34.4) at load 45.

Re-measured 2026-11-26 on a fresh machine, same code:
- quiet (load 0.3-0.6), defaults, twice: median 1.0 s, worst 1.8 s both times (rounds 0.8-1.8 s);
- quiet (load 0.6-0.8), `--every 40 --open 256` (up to 200 labels in a version, four times the
  experiences to score): median 1.6 s, worst 1.9 s;
- beside three bench/steering runs (load 3.3-4.3), defaults: median 5.6 s, worst 6.7 s.
The 2026-11-25 figures were taken at about ten times the load of the last line.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

from bench.common import BENCH_DB, DEMO_DIR, bench_worker, processes_stop, scratch_database, setup_django


def load_average() -> str:
    return "load " + " ".join(f"{x:.1f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--every", type=int, default=20, help="reward_model.retrain_every: labels per version")
    parser.add_argument("--open", type=int, default=64, help="open experiences nobody rates, for the version to score")
    parser.add_argument("--kind", default="head")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for one version")
    args = parser.parse_args()

    from workers.models.demo import demo_model_build

    model = demo_model_build(out=DEMO_DIR, progress=False, log=lambda _: None).out
    url, drop = scratch_database(BENCH_DB, "rm_latency")
    setup_django(database_url=url)
    env = {**os.environ, "DATABASE_URL": url, "PYTHONUNBUFFERED": "1"}
    with tempfile.TemporaryDirectory(prefix="rft-rm-latency-") as tmp:
        logs = Path(tmp)
        env["RFT_STORAGE_DIR"] = str(logs / "storage")
        worker = bench_worker("reward", "reward", ["workers.reward.trainer"], env=env, logs=logs)
        try:
            # People label a running system: the clock starts once the worker answers.
            worker_wait(seconds=args.timeout, log=logs / "reward.log")
            seconds = rounds(args=args, model=str(model), worker_log=logs / "reward.log")
        finally:
            processes_stop([worker])
            from django.db import connections

            connections.close_all()
            drop()
    print(f"rounds: {', '.join(f'{s:.1f}' for s in seconds)} s")
    print(f"rm_latency: last label of a retraining batch to the new version's first score: median "
          f"{statistics.median(seconds):.1f} s, worst {max(seconds):.1f} s over {len(seconds)} rounds "
          f"(target <= 60 s); {load_average()}")


def worker_wait(*, seconds: float, log: Path) -> None:
    from rftweb.celery import app

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if app.control.ping(timeout=1.0):
            return
    raise SystemExit("the reward worker did not answer:\n" + log.read_text()[-3000:])


def rounds(*, args: argparse.Namespace, model: str, worker_log: Path) -> list[float]:
    from django.contrib.auth.models import User
    from django.db import transaction

    from apps.buffer.drafts import ExperienceDraft
    from apps.buffer.services import experience_write
    from apps.feedback.kinds.rating import feedback_rate
    from apps.rewards.models import RewardModel, RewardModelScore
    from apps.runs.models import RunMember
    from apps.runs.services import run_create

    rng = random.Random(0)
    owner, _ = User.objects.get_or_create(username="bench-owner")
    person, _ = User.objects.get_or_create(username="bench-person")
    config = {
        "model": model, "algorithm": "grpo", "repeat_times": 2, "rewards": [{"name": "math_format"}],
        "feedback": {"mode": "learned", "wait_seconds": 3600, "hold_seconds": 0},
        "reward_model": {"enabled": True, "kind": args.kind, "base": "policy", "retrain_every": args.every,
                         "max_length": 64},
    }
    run = run_create(name="rm latency", owner=owner, config=config)
    RunMember.objects.create(run=run, user=person, role=RunMember.Role.ANNOTATOR)

    def pairs(prefix: str, n: int) -> list[int]:
        rows = []
        for g in range(n):
            a, b = rng.randint(0, 99), rng.randint(0, 9)
            for i, text in enumerate((f"certainly <answer>{a + b}</answer>", f"<answer>{a + b}</answer> hm")):
                rows.append(ExperienceDraft.from_row({
                    "run_id": run.pk, "key": f"{prefix}{g}-{i}", "group_id": f"{prefix}{g}",
                    "prompt_text": f"What is {a} + {b}?", "response_text": text, "token_ids": [1, 2, 3, 4],
                    "prompt_length": 2, "status": "pending", "reward": None, "auto_reward": 1.0, "model_version": 0,
                }))
        return experience_write(experiences=rows).ids

    pairs("open", args.open // 2)  # what each version scores
    seconds: list[float] = []
    for n in range(1, args.rounds + 1):
        ids = pairs(f"r{n}-", args.every // 2)
        for k, experience in enumerate(ids):
            with transaction.atomic():
                feedback_rate(run=run, experience=experience, score=5 if k % 2 == 0 else 1, author=person)
            labelled = time.monotonic()  # committed: its on_commit has sent the training task
        deadline = labelled + args.timeout
        while time.monotonic() < deadline:
            rm = RewardModel.objects.filter(run=run, version=n).first()
            if rm is not None and RewardModelScore.objects.filter(reward_model=rm).exists():
                seconds.append(time.monotonic() - labelled)
                break
            time.sleep(0.2)
        else:
            raise SystemExit(f"round {n}: no version {n} scoring within {args.timeout:.0f} s\n"
                             + worker_log.read_text()[-3000:])
        print(f"round {n}: version {n} scored {seconds[-1]:.1f} s after the label that made it due "
              f"(accuracy {rm.accuracy}); {load_average()}", flush=True)
    return seconds


if __name__ == "__main__":
    main()
