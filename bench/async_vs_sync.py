"""Time for the same number of trainer steps, sync against async (max_staleness 2), through
the whole loop: the conductor, the explorer and the trainer as real Celery workers on
Postgres and Redis, GRPO on the demo model and taskset. Target: sync / async ≥ 1.6×.

Sync (interval 1, offset 0) makes the explorer wait for every version; async lets it
generate up to two versions ahead while the trainer steps, so the two overlap.

    python -m bench.async_vs_sync [--steps 8]

Needs the explorer (`workers.explorer`, `workers.demo_model`).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import BENCH_DB, ROOT, setup_django


def _worker(name: str, queues: str, include: list[str], env: dict[str, str], logs: Path) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "celery", "-A", "rftweb", "worker", "-P", "solo", "-Q", queues, "-n", f"{name}@%h",
           "--without-heartbeat", "--without-gossip", "--without-mingle", "-l", "WARNING"]
    for module in include:
        cmd += ["-I", module]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=(logs / f"{name}.log").open("ab"), stderr=subprocess.STDOUT)


def _timed_run(*, mode: str, steps: int, model_dir: Path, taskset: object, owner: object) -> float:
    from apps.runs.models import Run
    from apps.runs.services import run_create, run_transition

    config = {
        "model": str(model_dir), "mode": mode, "algorithm": "grpo", "engine": "transformers",
        "sync_interval": 1, "sync_offset": 0, "max_staleness": 2 if mode == "async" else 0,
        "explore_batch_size": 8, "repeat_times": 4, "train_batch_size": 32, "total_steps": steps,
        "sampling": {"temperature": 1.0, "max_tokens": 12},
        "rewards": [{"name": "exact_match"}], "trainer": {"learning_rate": 1e-4, "loss_type": "grpo"},
    }
    run = run_create(name=f"bench {mode}", owner=owner, config=config, taskset=taskset)
    started = time.perf_counter()
    run_transition(run=run, action="start")
    deadline = started + 1800
    while time.perf_counter() < deadline:
        run.refresh_from_db()
        if run.status in (Run.Status.STOPPED, Run.Status.FAILED):
            break
        time.sleep(0.2)
    seconds = time.perf_counter() - started
    if run.status != Run.Status.STOPPED or run.train_step != steps:
        raise SystemExit(f"{mode} run did not finish: status={run.status} train_step={run.train_step} error={run.error}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="rft-bench-async-"))
    os.environ["RFT_STORAGE_DIR"] = str(tmp / "storage")
    setup_django()
    import redis
    from django.conf import settings
    from django.contrib.auth.models import User

    from apps.buffer.importers import taskset_import
    from workers.demo_model import TASKSET_FILE, demo_model_build

    demo = demo_model_build(out=ROOT / ".cache" / "demo-model", progress=False, log=lambda _: None)
    owner, _ = User.objects.get_or_create(username="bench-async")
    taskset = taskset_import(name="demo", path=demo.out / TASKSET_FILE, owner=owner)
    redis.Redis.from_url(settings.REDIS_URL).flushdb()

    env = dict(os.environ, DATABASE_URL=BENCH_DB, DJANGO_SETTINGS_MODULE="rftweb.settings", PYTHONPATH=str(ROOT),
               RFT_STORAGE_DIR=str(tmp / "storage"), RFT_CONDUCT_SECONDS="0.2", OMP_NUM_THREADS="1")
    procs = [
        _worker("conductor", "default", [], env, tmp),
        _worker("trainer", "train", ["workers.trainer"], env, tmp),
        _worker("explorer", "rollout", ["workers.explorer"], env, tmp),
    ]
    try:
        time.sleep(15)  # workers up; the first step of each run also pays the model loads
        _timed_run(mode="sync", steps=1, model_dir=demo.out, taskset=taskset, owner=owner)  # warm-up
        sync_s = _timed_run(mode="sync", steps=args.steps, model_dir=demo.out, taskset=taskset, owner=owner)
        async_s = _timed_run(mode="async", steps=args.steps, model_dir=demo.out, taskset=taskset, owner=owner)
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{'mode':<8} {'steps':>5} {'seconds':>8}")
    print(f"{'sync':<8} {args.steps:>5} {sync_s:>8.1f}")
    print(f"{'async':<8} {args.steps:>5} {async_s:>8.1f}")
    print(f"async_vs_sync speed-up (sync seconds / async seconds, max_staleness 2): {sync_s / async_s:.2f}")


if __name__ == "__main__":
    main()
