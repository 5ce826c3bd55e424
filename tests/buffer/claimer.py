"""A claimer process for the concurrency tests: claims batches from one run until the
buffer is empty, acking each, and prints every claimed id as one JSON line per batch.

    python tests/buffer/claimer.py RUN_ID WORKER SIZE [--hold] [--group]

--hold claims one batch, prints it, and then sleeps (to be killed with SIGKILL).
--gate DIR writes DIR/ready-WORKER once Django is up, then starts claiming only when DIR/go
exists: the test releases every claimer at once (on a loaded machine one process could
otherwise empty the buffer before the others have imported Django).
"""

from __future__ import annotations

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "rftweb.settings")

import django

django.setup()

from apps.buffer.services import batch_ack, batch_claim
from apps.runs.models import Run


def gate_wait(gate: str, worker: str) -> None:
    open(os.path.join(gate, f"ready-{worker}"), "w").close()
    deadline = time.monotonic() + 300
    while not os.path.exists(os.path.join(gate, "go")) and time.monotonic() < deadline:
        time.sleep(0.01)


def main() -> None:
    run_id, worker, size = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    hold, group = "--hold" in sys.argv, "--group" in sys.argv
    run = Run.objects.get(pk=run_id)
    if "--gate" in sys.argv:
        gate_wait(sys.argv[sys.argv.index("--gate") + 1], worker)
    empty_polls = 0
    while empty_polls < 3:
        batch = batch_claim(run=run, worker=worker, size=size, group_complete=group, lease_seconds=2 if hold else 60)
        if not batch:
            empty_polls += 1
            time.sleep(0.2)
            continue
        empty_polls = 0
        print(json.dumps([e.pk for e in batch]), flush=True)
        if hold:
            time.sleep(3600)
        batch_ack(run=run, worker=worker, ids=[e.pk for e in batch])


if __name__ == "__main__":
    main()
