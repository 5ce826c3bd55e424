"""`python tests/trainer/limited_rank0.py OUT WARM_RUN RUN WEIGHT_BYTES SHARE MODE`: a train
worker's process as rank 0 of a learner group under an address-space limit (RLIMIT_AS).

It trains step 1 of WARM_RUN (a two-process run on a tiny model: what torch, TRL, gloo and
Django set up once), drops that resident (its group ends), then is held to SHARE ×
WEIGHT_BYTES more address space than it has and trains step 1 of RUN (a two-process run
whose model's weights are WEIGHT_BYTES) through `trainer_step`, as a train task does. MODE
`whole`: rank 0 loads the whole model first, as it did before it built on its shards only.
OUT gets what happened: `trained …`, or `failed: <error>`.
"""

from __future__ import annotations

import ctypes
import os
import resource
import sys
from pathlib import Path


def _vm_bytes() -> int:
    with open("/proc/self/status") as fh:
        return int(next(line for line in fh if line.startswith("VmSize:")).split()[1]) * 1024


def main(out: Path, warm_run: int, run: int, weight_bytes: int, share: float, mode: str) -> None:
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "rftweb.settings")
    django.setup()
    import torch

    from workers import trainer
    from workers.algorithms import shard_load

    torch.set_num_threads(1)
    # One malloc arena (MALLOC_ARENA_MAX=1 in the environment does it for the followers): a
    # thread's own arena reserves 64 MB of address space at once.
    ctypes.CDLL("libc.so.6").mallopt(-8, 1)  # M_ARENA_MAX
    if mode == "whole":
        shard_load.rank0_sharded_fits = lambda **_: False  # type: ignore[assignment]
    warm = trainer.trainer_step(run_id=warm_run, step=1)
    assert warm["status"] == "trained", warm
    trainer.resident_drop(warm_run)
    limit = _vm_bytes() + int(share * weight_bytes)
    resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))
    try:
        outcome = trainer.trainer_step(run_id=run, step=1)
        result = f"{outcome['status']} {outcome}"
    except BaseException as exc:  # noqa: BLE001 (what the limit does is the outcome)
        out.write_text(f"failed: {type(exc).__name__}: {exc}"[:2000])
        os._exit(0)  # a follower may be inside a collective; the outcome is written
    out.write_text(result)
    trainer.resident_drop(run)


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]), sys.argv[6])
