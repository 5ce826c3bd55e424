"""A learner gang's follower: a rank other than rank 0, in a process of its own
(`python -m workers.trainer.follower rank ADDR PORT RANK PARENT GENERATION`, started by rank
0's LearnerGang, workers/algorithms/gang.py), and another host's part of a gang (`python -m
workers.trainer.follower join ADDR PORT HOST`). It builds the run's learner as the train
worker does (workers/trainer/resident.py's `policy_load`), takes rank 0's state, and trains on
every batch rank 0 sends (the journal's entry, workers/trainer/journal.py) until told to stop.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from kernel.config import config_validate
from kernel.plugins import PluginMissing, plugins_load
from workers.algorithms.gang import (
    READY,
    Channel,
    GangPlan,
    GangUnsupported,
    beat_start,
    code_check,
    dist_store,
    gang_backend,
    gang_join,
    host_join,
    op_await,
    refusal_set,
    state_share,
)
from workers.algorithms.learner import Learner, spec_from_config
from workers.algorithms.trainee import NothingToTrain
from workers.algorithms.sharding import (
    LearnerBuild,
    learner_shard,
    learner_sharded_build,
    sharded_load,
    sharded_save,
    whole_gather,
)
from workers.engines.base import tokenizer_from_pretrained
from workers.host_memory import cpu_allocator_tune, rank_mmap_threshold
from workers.trainer.journal import journal_decode, rng_restore
from workers.models.policy import policy_load

if TYPE_CHECKING:
    import torch.distributed as dist
    from transformers import PreTrainedTokenizerBase

    from kernel.config import RunConfig
    from workers.algorithms.trainee import LearnerSpec

log = logging.getLogger(__name__)


def _orphan_watch(parent: int) -> None:
    """End this follower when rank 0's process is gone (killed worker, crashed task)."""
    def watch() -> None:
        while True:
            if os.getppid() != parent:
                os._exit(3)
            time.sleep(1.0)

    threading.Thread(target=watch, name="learner-gang-parent", daemon=True).start()


def follower_main(*, addr: str, port: int, rank: int, generation: int, parent: int = 0) -> None:
    """A follower: build the run's learner as rank 0 did, take rank 0's state, shard it,
    then train on every batch it sends until told to stop. What stops it before it joins
    goes to rank 0 as its refusal (`refusal_set`)."""
    if parent:
        _orphan_watch(parent)
    store, _ = dist_store(addr, port, generation)
    # From the start: while it loads, rank 0 sees it starting rather than absent.
    beat_start(addr=addr, port=port, generation=generation, rank=rank)
    try:
        start = _follower_ready(store, rank=rank)
    except BaseException as exc:
        refusal_set(store, exc, where=f"rank {rank}")
        raise
    import torch.distributed as dist

    plan = start.plan
    store.set(f"{READY}/{rank}", "1")
    store.add(READY, 1)
    gang_join(store=store, rank=rank, world=plan.world, backend=start.backend, timeout=start.timeout)
    try:
        channel = Channel()
        if start.learner is None:  # sharded_load: its shards only, rank 0's trainable state into them
            learner = follower_learner_sharded(start, rank=rank)
        else:
            learner = start.learner
            state_share(channel, learner, rank=rank)
        shard = learner_shard(learner, rank=rank, world=plan.world, sharding=plan.sharding,
                              from_rank0=start.learner is None and not start.rank0_sharded)
        if start.checkpoint:
            sharded_load(learner, Path(start.checkpoint))
        number = 0
        while True:
            number += 1
            if not op_await(store, number):
                log.warning("learner gang: rank 0 gave the gang up (a rank was lost); rank %s ends", rank)
                return
            msg = channel.message()
            op = msg.get("op")
            if op == "stop":
                return
            if op == "whole":
                whole_gather(learner)
            elif op == "save":
                sharded_save(learner, Path(msg["path"]))
            elif op == "step":
                batch, rng = journal_decode(channel.bytes(None))
                rng_restore(rng)
                try:
                    learner.step(batch, shard=shard)
                except NothingToTrain:
                    pass  # decided on the whole batch: every rank skipped this update together
    finally:
        dist.destroy_process_group()


@dataclass(frozen=True)
class _FollowerReady:
    """What a follower needs to join: the run's learner (None where it loads only its
    shards, once joined: `follower_learner_sharded`), the gang's plan, its backend and
    timeout, the sharded snapshot to start from (if any), and whether rank 0 loaded only its
    shards too (then no rank takes rank 0's trainable state: they agree already)."""
    learner: Learner | None
    plan: GangPlan
    backend: str
    timeout: datetime.timedelta
    checkpoint: str | None
    cfg: RunConfig
    spec: LearnerSpec
    tokenizer: PreTrainedTokenizerBase
    rank0_sharded: bool = False
    source: str | None = None  # the policy's weights where not the run's model (LearnerBuild.source)



def follower_learner_sharded(start: _FollowerReady, *, rank: int) -> Learner:
    """A follower's learner on its shards only of the run's model (and of the reference
    model, or the frozen base under an adapter), built once the gang is joined (the shards
    are the mesh's)."""
    return learner_sharded_build(LearnerBuild(cfg=start.cfg, spec=start.spec, tokenizer=start.tokenizer, source=start.source),
                                 world=start.plan.world, sharding=start.plan.sharding)


def _follower_ready(store: dist.Store, *, rank: int) -> _FollowerReady:
    """The run's learner built from the gang's spec in rank 0's store as rank 0 built its
    own, with the rest of what joining takes (`_FollowerReady`)."""
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "rftweb.settings")
    django.setup()

    spec_in = json.loads(store.get("rft/spec"))
    code_check(spec_in, where=f"rank {rank}")  # its files may have changed since rank 0 started
    try:
        # Rank 0's plugin modules (its RFT_PLUGINS), whatever this rank's environment names:
        # the run's algorithm may be one of theirs.
        plugins_load(spec_in.get("plugins") or [], where=f"rank {rank}, as rank 0's RFT_PLUGINS")
    except PluginMissing as exc:
        raise GangUnsupported(f"{exc}; install it on every host of a learner gang") from exc
    plan = GangPlan(world=int(spec_in["world"]), hosts=int(spec_in["hosts"]), sharding=str(spec_in["sharding"]))
    backend, _ = gang_backend(plan.local)
    if torch.cuda.is_available():
        torch.cuda.set_device(rank % plan.local)
    cfg = config_validate(data=spec_in["config"])
    torch.manual_seed(cfg.seed)
    spec = spec_from_config(cfg)
    tokenizer = tokenizer_from_pretrained(cfg.tokenizer or cfg.model)
    from django.conf import settings

    if backend == "gloo" and settings.RFT_TRAINER_CPU_MMAP_THRESHOLD > 0:
        # As rank 0's worker does (workers/trainer/resident.py), before the learner is built:
        # scaled to this rank's share of the batch and of each gradient (workers/host_memory.py).
        cpu_allocator_tune(threshold=rank_mmap_threshold(settings.RFT_TRAINER_CPU_MMAP_THRESHOLD, world=plan.world))
    checkpoint = spec_in.get("checkpoint")
    learner = None
    if not spec_in.get("sharded_load"):
        model, ref_model = policy_load(cfg=cfg, spec=spec, source=cfg.model)
        learner = Learner(spec=spec, model=model, tokenizer=tokenizer, ref_model=ref_model)
    return _FollowerReady(learner=learner, plan=plan, backend=backend,
                          timeout=datetime.timedelta(seconds=float(spec_in["timeout_s"])),
                          checkpoint=str(checkpoint) if checkpoint else None, cfg=cfg, spec=spec, tokenizer=tokenizer,
                          rank0_sharded=bool(spec_in.get("rank0_sharded")), source=spec_in.get("source"))



if __name__ == "__main__":
    if sys.argv[1] == "join":
        # join ADDR PORT HOST: this host's ranks of the learner gang rank 0 opened at ADDR:PORT.
        try:
            sys.exit(host_join(addr=sys.argv[2], port=int(sys.argv[3]), host=int(sys.argv[4])))
        except GangUnsupported as exc:
            sys.exit(f"learner gang: {exc}")  # the message on stderr, exit status 1
    # rank ADDR PORT RANK PARENT GENERATION: a follower rank 0 (or `join`) started on its host.
    follower_main(addr=sys.argv[2], port=int(sys.argv[3]), rank=int(sys.argv[4]), parent=int(sys.argv[5]),
                  generation=int(sys.argv[6]))
    # Told to stop, it has left the gang and written what it was asked to: end now, as
    # multiprocessing's children do. The interpreter's own teardown with torch loaded took
    # 3.9 s here and 11.6 s beside five busy loops (most of it collecting torch's objects),
    # longer than rank 0 waits before it kills a follower.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
