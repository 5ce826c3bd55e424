"""The conductor's own cost per beat, in process: statements and CPU milliseconds of one
`conductor_beat_task` (the loop's beat, apps/control/conductor.py) for a run in an async
run's steady state, where the beat comes every RFT_CONDUCT_SECONDS for every running run:

- `async`: an explore step running on a live worker (its heartbeat fresh, the step in its
  active list) and a train step running under the trainer's lock (held here, from a second
  connection, as a live trainer holds it);
- `idle`: an explore-mode run whose step is out (a sent message no worker took yet).

Nothing is sent: the steps stay out, so each beat only reads. CPU is the process's own
(time.process_time), so the load of the host inflates it less than wall-clock, but the load
average is printed beside each figure all the same.

    python -m bench conductor_beat [--beats 500] [--repeat 3]

bench/async_vs_sync measures the same through the real loop (the conductor worker's CPU over
a timed run, divided by its beats).

Measured 2026-11-23 (round 11), load 2.7-5.0 (the test suite running), this round's change
stashed and not, alternated:
- a first version of this bench, 500 beats × 3, twice each: async steady state 6 statements and
  7.4-10.2 ms of CPU a beat before, 4 statements and 4.5-5.9 ms after;
- this bench, 300 beats × 2: async 7.66 ms (7.38..7.95) before, 4.04 ms (3.84..4.24) after,
  0.53x; idle 3 statements both, 5.13 / 3.88 ms (noise: the idle beat did not change).
The change: a beat under a train step that is out no longer counts the buffer
(`train_readiness`, 2 statements: the trainer, going on from step to step itself, asks that)
and reads no heartbeat for a train step (the trainer's lock decides).
"""

from __future__ import annotations

import argparse
import os
import time
import uuid
from datetime import timedelta

from bench.common import BENCH_DB, median, setup_django


def _async_run() -> int:
    from django.utils import timezone

    from apps.runs.models import Dispatch, ModelVersion, Run, WorkerHeartbeat
    from tests.factories import make_run, make_taskset, make_user

    owner = make_user("beat-" + uuid.uuid4().hex[:8])
    run = make_run(owner=owner, taskset=make_taskset(owner=owner), mode="async", max_staleness=2,
                   explore_batch_size=2, repeat_times=4, train_batch_size=8, total_steps=1000)
    Run.objects.filter(pk=run.pk).update(status=Run.Status.RUNNING, explore_step=5, train_step=4, current_version=4)
    for n in range(5):
        ModelVersion.objects.get_or_create(run=run, number=n, defaults={"checkpoint": "bench", "train_step": n})
    now = timezone.now()
    host = f"explorer-{run.pk}@bench"
    WorkerHeartbeat.objects.update_or_create(hostname=host, defaults={
        "started_at": now - timedelta(hours=1), "last_seen": now + timedelta(hours=1), "active": [{"id": f"e{run.pk}"}]})
    Dispatch.objects.create(run=run, job="explore", step=6, state="running", task_id=f"e{run.pk}", worker=host,
                            holder=host, sent_at=now, started_at=now - timedelta(hours=1))
    Dispatch.objects.create(run=run, job="train", step=5, state="running", task_id=f"t{run.pk}",
                            worker="trainer@bench", holder="trainer@bench", sent_at=now, started_at=now - timedelta(hours=1))
    return int(run.pk)


def _idle_run() -> int:
    from django.utils import timezone

    from apps.runs.models import Dispatch, Run
    from tests.factories import make_run, make_taskset, make_user

    owner = make_user("beat-" + uuid.uuid4().hex[:8])
    run = make_run(owner=owner, taskset=make_taskset(owner=owner), mode="explore", total_steps=1000)
    Run.objects.filter(pk=run.pk).update(status=Run.Status.RUNNING, explore_step=0)
    Dispatch.objects.create(run=run, job="explore", step=1, state="sent", task_id=f"e{run.pk}",
                            sent_at=timezone.now() + timedelta(hours=1))
    return int(run.pk)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--beats", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    os.environ.setdefault("REDIS_URL", "redis://localhost:6379/15")
    setup_django()
    import psycopg
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from apps.control.conductor_beat import conductor_beat_task
    from apps.runs.models import Run
    from apps.control.conductor import TRAINER_LOCK_NAMESPACE, conductor_beat

    Run.objects.filter(status=Run.Status.RUNNING).update(status=Run.Status.STOPPED)  # this bench's runs only
    for name, make in (("async", _async_run), ("idle", _idle_run)):
        run_id = make()
        with psycopg.connect(BENCH_DB, autocommit=True) as trainer:
            trainer.execute("SELECT pg_advisory_lock(%s, %s)", (TRAINER_LOCK_NAMESPACE, run_id))
            conductor_beat()
            with CaptureQueriesContext(connection) as queries:
                advanced = conductor_beat()
            assert not advanced[run_id].dispatched, f"the {name} state sent a step: {advanced}"
            cpu = []
            for _ in range(args.repeat):
                start = time.process_time()
                for _ in range(args.beats):
                    conductor_beat_task.apply()
                cpu.append((time.process_time() - start) / args.beats * 1000)
                print(f"{name:5s} {len(queries.captured_queries)} statements a beat, "
                      f"{cpu[-1]:.2f} ms CPU a beat  (load {os.getloadavg()[0]:.2f})", flush=True)
            print(f"{name:5s} median {median(cpu):.2f} ms, spread {min(cpu):.2f}..{max(cpu):.2f}")
        Run.objects.filter(pk=run_id).update(status=Run.Status.STOPPED)


if __name__ == "__main__":
    main()
