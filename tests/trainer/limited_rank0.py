"""`python tests/trainer/limited_rank0.py OUT WARM_RUN WHOLE_RUN SHARDED_RUN WEIGHT_BYTES SHARE`: a
train worker's process as rank 0 of a learner gang under an address-space limit (RLIMIT_AS).

It trains step 1 of WARM_RUN (a two-process run on a tiny model: what torch, TRL, gloo and
Django set up once), drops that resident (its gang ends), then is held to SHARE ×
WEIGHT_BYTES more address space than it has and, through `trainer_step` as a train task does,
trains step 1 of WHOLE_RUN with rank 0 loading the whole model first (as it did before it
built on its shards only), then under the same limit step 1 of SHARDED_RUN (both two-process
runs whose model's weights are WEIGHT_BYTES) building on its shards only. OUT gets what
happened to each, a JSON object {"whole": …, "sharded": …}: `trained …`, or `failed: <error>`.
One process for both: a second would set up Django, torch and a warm gang again.
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import resource
import sys
from pathlib import Path


def _vm_bytes() -> int:
    with open("/proc/self/status") as fh:
        return int(next(line for line in fh if line.startswith("VmSize:")).split()[1]) * 1024


def main(out: Path, warm_run: int, whole_run: int, sharded_run: int, weight_bytes: int, share: float) -> None:
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "rftweb.settings")
    django.setup()
    import torch

    from workers.trainer import resident as trainer_resident, step as step_module
    from workers.models.policy import policy_load
    from workers.algorithms import sharding

    torch.set_num_threads(1)
    # One malloc arena (MALLOC_ARENA_MAX=1 in the environment does it for the followers): a
    # thread's own arena reserves 64 MB of address space at once.
    ctypes.CDLL("libc.so.6").mallopt(-8, 1)  # M_ARENA_MAX
    from apps.runs.models import Run
    from workers.algorithms import spec_from_config

    warm = step_module.trainer_step(run_id=warm_run, step=1)
    assert warm["status"] == "trained", warm
    trainer_resident.resident_drop(warm_run)
    # The whole load's path warmed up too (its lazy imports are not what the limit meets).
    cfg = Run.objects.get(pk=warm_run).cfg
    policy_load(cfg=cfg, spec=spec_from_config(cfg), source=str(cfg.model))
    gc.collect()
    limit = _vm_bytes() + int(share * weight_bytes)
    resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))
    outcome = {}
    sharded_fits = sharding.rank0_sharded_fits
    sharding.rank0_sharded_fits = lambda **_: False  # type: ignore[assignment]
    try:
        result = step_module.trainer_step(run_id=whole_run, step=1)
        outcome["whole"] = f"{result['status']} {result}"
    except BaseException as exc:  # noqa: BLE001 (what the limit does is the outcome)
        # The whole load fails before the gang starts: nothing of it is left but its memory,
        # freed here (mapped blocks, returned) before the sharded build under the same limit.
        outcome["whole"] = f"failed: {type(exc).__name__}: {exc}"[:2000]
    sharding.rank0_sharded_fits = sharded_fits  # type: ignore[assignment]
    trainer_resident.resident_drop(whole_run)
    gc.collect()
    try:
        result = step_module.trainer_step(run_id=sharded_run, step=1)
        outcome["sharded"] = f"{result['status']} {result}"
    except BaseException as exc:  # noqa: BLE001 (what the limit does is the outcome)
        outcome["sharded"] = f"failed: {type(exc).__name__}: {exc}"[:2000]
        out.write_text(json.dumps(outcome))
        os._exit(0)  # a follower may be inside a collective; the outcome is written
    out.write_text(json.dumps(outcome))
    trainer_resident.resident_drop(sharded_run)


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), float(sys.argv[6]))
