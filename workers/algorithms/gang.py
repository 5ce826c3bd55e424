"""A learner as a gang of processes, on PyTorch's own sharding: FSDP2 (`fully_shard`) or,
sharded `none`, DistributedDataParallel (gloo on CPU, NCCL on GPUs).

Every rank builds the same learner, takes rank 0's trainable state (weights, optimizer),
then shards it (`learner_shard`): with `trainer.sharding: full` parameters, gradients and
optimizer state are split across the ranks and each decoder block's weights are gathered
for its forward and backward and freed after (ZeRO-3); `grad_op` keeps the gathered
weights from the forward to the backward (ZeRO-2: less traffic, more memory); `none`
replicates the model and averages gradients (DDP). bf16 on GPUs is FSDP2's
`MixedPrecisionPolicy` (bf16 compute, fp32 gradient reduction; the sharded master weights
stay fp32).

Each rank trains on its part of every batch (`Objective.shard_loss`: rows dealt
round-robin, each part weighted by its share of the whole batch's normaliser — sequences,
completion tokens or pairs, as TRL normalises each loss — with GRPO advantages taken on
the whole batch first), so the reduced gradient, and the update, is the one-process update
on the whole batch. Every algorithm and loss type runs so.

`LearnerGang` is how a train worker runs a run's learner that way (`trainer.processes`
> 1): its own process is rank 0 and keeps everything the trainer does (claims, journal,
commits, checkpoints, versions); it starts the other ranks (`python -m
workers.trainer.follower`) and they join one process group through a TCP store on
rank 0's host (RFT_LEARNER_ADDR / RFT_LEARNER_PORT). Rank 0 sends them each step's batch
(the journal entry, with the RNG state it starts from). The plugin modules rank 0 loaded
(RFT_PLUGINS, kernel/plugins.py) are in the gang's spec, and every other rank imports them
before it reads the run's config: an algorithm added from a file of its own trains sharded
too. Rank 0 too builds its learner on its
shards only where it starts from the run's model (workers/algorithms/sharding.py). A
published version is a whole model: the ranks gather it one tensor at a time into rank 0's
skeleton of the policy (`whole`, on the meta device), which lets go of it at the next step. Snapshots are sharded (`torch.distributed.checkpoint`: each rank writes its
shard; they load on any number of ranks, or in one process).

The gang is the process's default process group (DeviceMesh needs one), so a train
worker runs one learner gang at a time and cannot also hold the NCCL weight sync's
group (RFT_WEIGHT_SYNC=nccl). A follower ends when rank 0 closes the gang or its parent
process goes away; a rank that stops before joining tells rank 0 why through the store, and
the gang's start fails at once with that reason (`ranks_await`).

Every collective and the rendezvous wait at most the run's `trainer.collective_timeout_s`
(gloo's and NCCL's own timeout, set when the gang is made). A rank whose host is lost or
whose link is cut sends no reset: the others' collective waits that long and fails; a rank
whose process dies fails it at once (its connection resets). Either way rank 0 raises
GangLost naming the ranks that stopped answering and their hosts (each follower keeps a
heartbeat counter in rank 0's store and says there at which address it reaches rank 0), and
nothing of the step is committed. Between steps a follower waits for rank 0's next operation
in the store (`op_await`), not inside a collective, so a gang idle for longer than the
timeout (rollouts between two steps) is not taken for a lost one.
"""


from __future__ import annotations

import datetime
import functools
import hashlib
import importlib.metadata
import json
import logging
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal, TypedDict

import torch

from kernel.exceptions import InvalidInput
from kernel.jsontypes import JSONObject
from kernel.plugins import plugins_loaded
from workers.algorithms.trainee import NothingToTrain
from workers.algorithms.objectives import objective_class
from workers.algorithms.sharding import (
    learner_shard,
    learner_sharded_build,
    sharded_load,
    sharded_load_fits,
    sharded_save,
    whole_assign,
    whole_gather,
    whole_release,
    whole_write,
)
from workers.gang_lost import GangLost

if TYPE_CHECKING:
    import torch.distributed as dist

    from workers.algorithms.batch import TrainBatch
    from workers.algorithms.learner import Learner
    from workers.algorithms.sharding import LearnerBuild

log = logging.getLogger(__name__)

# How long rank 0 waits for a follower it told to stop (or terminated) before it kills it: a
# backstop, not a pace. A follower ends at once (`os._exit` below), but a host's load can hold
# any process off the CPU for seconds.
FOLLOWER_EXIT_S = 60.0
# A follower adds one to its heartbeat counter in rank 0's store every BEAT_S (a thread of its
# own, which runs while the rank computes or waits in a collective). After a failed
# collective rank 0 watches the counters for SILENT_S: the ranks whose counter did not move
# are the ones lost (a stopped or cut-off process, or a host gone).
BEAT_S = 0.5
SILENT_S = 3.0
# How often a follower between steps looks for rank 0's next operation in the store.
OP_POLL_S = 0.05

# The follower's program (its `rank` and `join` commands): the trainer's, since a follower
# rebuilds the learner as the train worker does. Named here, not imported: the gang starts
# it as a process of its own.
FOLLOWER_MODULE = "workers.trainer.follower"


# ----------------------------------------------------------------------------- a gang of processes


class GangUnsupported(InvalidInput, ValueError):
    """This host cannot run the learner gang asked for (say, fewer GPUs than processes)."""

    code = "gang_unsupported"


def gang_backend(local: int) -> tuple[str, str]:
    """(backend, rank 0's device) for `local` learner processes on this host: NCCL (gloo
    beside it for the CPU messages) with a GPU per process, gloo where there is no GPU; a
    host with GPUs, but fewer than processes, is refused (NCCL will not put two ranks on
    one GPU)."""
    if not torch.cuda.is_available():
        return "gloo", "cpu"
    if torch.cuda.device_count() < local:
        raise GangUnsupported(f"trainer.processes: {local} learner processes need {local} GPUs on the train "
                              f"worker's host; it has {torch.cuda.device_count()}")
    return "cpu:gloo,cuda:nccl", "cuda:0"


@functools.cache
def code_fingerprint() -> dict[str, str]:
    """What every rank must share with rank 0: this checkout's Python sources (apps, workers,
    rftweb) and the libraries that shape the model and the messages. Read once a process (at
    its first gang), so files changed under a running worker after that do not move it."""
    root = Path(__file__).resolve().parents[2]
    digest = hashlib.sha256()
    for path in sorted(p for part in ("apps", "workers", "rftweb") for p in (root / part).rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    out = {"sources": digest.hexdigest()[:16]}
    for lib in ("torch", "transformers", "trl"):
        out[lib] = importlib.metadata.version(lib)
    return out


def code_check(spec: dict[str, object], *, where: str) -> None:
    """GangUnsupported naming what differs when this process runs other code than rank 0
    (whose fingerprint the gang's spec carries): on other code a rank would fail inside a
    collective, with an error about tensor sizes rather than the cause."""
    theirs = spec.get("code")
    mine = code_fingerprint()
    if not isinstance(theirs, dict):
        theirs = {}
    differ = [f"{k} {mine[k]} here, {theirs.get(k, 'unknown')} at rank 0" for k in mine if theirs.get(k) != mine[k]]
    if differ:
        raise GangUnsupported(f"{where} runs other code than rank 0 ({'; '.join(differ)}): install the same "
                              "commit and libraries on every host of a learner gang")


# A gang's start in rank 0's store: each other rank adds one to READY just before it joins
# the process group; a rank, or another host's `join`, that cannot join sets REFUSED to why.
# Rank 0 waits on these before it joins itself (`ranks_await`): a refusal, or a follower that
# ended, fails the gang start at once with its reason, where waiting inside the process
# group's rendezvous would last its whole timeout (the train task's time limit) and then say
# only that it timed out.
READY, REFUSED = "rft/ready", "rft/refused"
# Each follower's address as it reaches rank 0 (HOST + rank), its heartbeat counter (BEAT +
# rank), and rank 0's operations in turn (OP + number: "go", or "abort" for a broken gang).
# Another host's `join` keeps a heartbeat of its own (JOINING + host) from when it has read the
# gang's plan: its ranks are starting (torch imported, the model loaded), not lost.
HOST, BEAT, OP, JOINING = "rft/host/", "rft/beat/", "rft/op/", "rft/joining/"


def _address_towards(addr: str, port: int) -> str:
    """This host's address on the way to addr (what rank 0 names a lost rank's host by)."""
    import socket

    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((addr, port))  # a datagram socket sends nothing: only the route is looked up
            return str(s.getsockname()[0])
    except OSError:
        return socket.gethostname()


def beat_start(*, addr: str, port: int, generation: int, rank: int | None = None, host: int | None = None) -> None:
    """Keep a heartbeat in rank 0's store until the store goes, over a connection of its own
    (a store client is not shared between threads): a rank's (saying first at which address
    it reaches rank 0), or another host's `join`'s."""
    store, _ = dist_store(addr, port, generation)
    if rank is not None:
        store.set(f"{HOST}{rank}", _address_towards(addr, port))
    key = f"{BEAT}{rank}" if rank is not None else f"{JOINING}{host}"

    def beat() -> None:
        while True:
            try:
                store.add(key, 1)
            except Exception:
                return  # rank 0's store is gone: so is the gang
            time.sleep(BEAT_S)

    threading.Thread(target=beat, name="learner-gang-beat", daemon=True).start()


def ranks_silent(store: dist.Store, *, world: int, watch_s: float = SILENT_S) -> list[int]:
    """The other ranks whose heartbeat did not move in `watch_s` (rank 0 calls it after a
    collective failed)."""
    keys = [f"{BEAT}{r}" for r in range(1, world)]
    before = [store.add(k, 0) for k in keys]
    time.sleep(watch_s)
    return [r for r, k, b in zip(range(1, world), keys, before, strict=True) if store.add(k, 0) == b]


def rank_where(store: dist.Store, rank: int) -> str:
    """'rank R (host H, ADDRESS)': a rank as the run page names it."""
    plan = json.loads(store.get("rft/spec"))
    host = rank // max(1, int(plan["world"]) // int(plan["hosts"]))
    at = store.get(f"{HOST}{rank}").decode() if store.check([f"{HOST}{rank}"]) else "address not known"
    return f"rank {rank} (host {host}, {at})"


def is_comm_error(exc: BaseException) -> bool:
    """Whether `exc` came out of a collective's transport (a peer gone, reset or timed out),
    not out of the step's own code."""
    import torch.distributed as dist

    text = str(exc)
    return isinstance(exc, (dist.DistError, TimeoutError)) or (
        isinstance(exc, RuntimeError) and any(s in text for s in ("/gloo/", "NCCL", "Connection reset", "Timed out")))


def op_await(store: dist.Store, number: int) -> bool:
    """Wait (as long as it takes) for rank 0's operation `number`; False: rank 0 gave the gang up."""
    key = f"{OP}{number}"
    while not store.check([key]):
        time.sleep(OP_POLL_S)
    return bool(store.get(key) != b"abort")


def refusal_set(store: dist.Store, exc: BaseException, *, where: str) -> None:
    """Tell rank 0 why `where` will not join: GangUnsupported stays one there (the run's
    error names what to change), anything else comes back as a RuntimeError."""
    why = str(exc) if isinstance(exc, GangUnsupported) else f"{where} could not start: {type(exc).__name__}: {exc}"
    try:
        store.set(REFUSED, json.dumps({"unsupported": isinstance(exc, GangUnsupported), "why": why}))
    except Exception:  # rank 0 gone too: nobody to tell
        log.warning("learner gang: could not tell rank 0 why %s stopped", where, exc_info=True)


def ranks_await(store: dist.Store, *, world: int, timeout: datetime.timedelta,
                followers: list[subprocess.Popen[bytes]], poll_s: float = 0.2) -> None:
    """Return once the other `world - 1` ranks are joining; raise with a rank's refusal
    (`refusal_set`), when a follower started here ended first, or, GangLost, when a rank has
    given no sign of life for `timeout`: ranks started here are waited for while they live,
    another host's while its `join` or the rank itself beats (`beat_start`; their start,
    torch imported and the model loaded, is not a host lost)."""
    local = len(followers) + 1  # ranks 0 … local − 1 are this host's
    deadline = time.monotonic() + timeout.total_seconds()
    beats: dict[str, tuple[int, float]] = {}  # key: (counter, when it last moved)
    while True:
        ended = [(p.pid, p.returncode) for p in followers if p.poll() is not None]
        if store.check([REFUSED]):  # read after `ended`: a follower sets it before it exits
            refusal = json.loads(store.get(REFUSED))
            raise (GangUnsupported if refusal["unsupported"] else RuntimeError)(f"learner gang: {refusal['why']}")
        if ended:
            raise RuntimeError(f"learner gang: follower process(es) ended before joining (pid, exit status): {ended}")
        ready = store.add(READY, 0)
        if ready >= world - 1:
            return
        absent = [r for r in range(1, world) if not store.check([f"{READY}/{r}"])]
        if any(r < local for r in absent) or _beating(store, [k for r in absent for k in (f"{BEAT}{r}", f"{JOINING}{r // local}")],
                                                       beats):
            deadline = time.monotonic() + timeout.total_seconds()
        elif time.monotonic() > deadline:
            who = ", ".join(f"rank {r} (host {r // local})" for r in absent)
            raise GangLost(f"learner gang: {who} did not come within {timeout.total_seconds():g} s "
                           "(trainer.collective_timeout_s); is `python -m workers.trainer.follower join ADDR "
                           "PORT HOST` running on every other host, and can it reach this one?")
        time.sleep(poll_s)


def _beating(store: dist.Store, keys: list[str], seen: dict[str, tuple[int, float]]) -> bool:
    """Whether any of these heartbeat counters moved within the last SILENT_S (`seen` keeps
    each one's last value and when it changed)."""
    now = time.monotonic()
    for key in keys:
        value = store.add(key, 0)
        if key not in seen or seen[key][0] != value:
            seen[key] = (value, now if value else 0.0)
    return any(now - seen[k][1] < SILENT_S for k in keys if seen[k][0])


def gang_join(*, store: dist.Store, rank: int, world: int, backend: str, timeout: datetime.timedelta) -> None:
    """Make the learner gang this process's default process group (FSDP2's DeviceMesh
    takes the default one)."""
    import torch.distributed as dist

    if dist.is_initialized():
        raise GangUnsupported("a learner gang needs this process's default process group, and it is taken (the NCCL "
                              "weight sync, or another run's learner gang): use RFT_WEIGHT_SYNC=checkpoint, or one "
                              "learner gang per train worker")
    dist.init_process_group(backend, store=dist.PrefixStore("learner", store), rank=rank, world_size=world,
                            timeout=timeout)


class GangMessage(TypedDict, total=False):
    """What rank 0 tells the other ranks over the channel: an operation (with the path a
    `save` writes to), or the names of the trainable weights when the gang starts."""

    op: Literal["step", "whole", "save", "stop"]
    path: str
    names: list[str]


class Channel:
    """Bytes and tensors from rank 0 to the other ranks (over the default group, on the CPU)."""

    def bytes(self, data: bytes | None) -> bytes:
        import torch.distributed as dist

        size = torch.tensor([len(data) if data is not None else 0], dtype=torch.int64)
        dist.broadcast(size, src=0)
        if data is not None:
            buf = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
        else:
            buf = torch.empty(int(size.item()), dtype=torch.uint8)
        dist.broadcast(buf, src=0)
        return data if data is not None else bytes(buf.numpy().tobytes())

    def message(self, msg: GangMessage | None = None) -> GangMessage:
        out: GangMessage = json.loads(self.bytes(json.dumps(msg).encode() if msg is not None else None))
        return out

    def tensors(self, tensors: list[torch.Tensor]) -> None:
        """Rank 0 sends, the others receive into, tensors of the same shapes (in place)."""
        import torch.distributed as dist

        for t in tensors:
            buf = t.detach().cpu().contiguous()
            dist.broadcast(buf, src=0)
            if buf is not t:
                with torch.no_grad():
                    t.copy_(buf)


def state_share(channel: Channel, learner: Learner, *, rank: int) -> None:
    """Make every rank's trainable weights and optimizer state rank 0's, before sharding (a
    frozen base is the run's model on every rank already)."""
    import io

    names = [n for n, p in learner.model.named_parameters() if p.requires_grad]
    got = channel.message({"names": names} if rank == 0 else None)["names"]
    if got != names:
        raise RuntimeError(f"learner gang: rank {rank} holds other trainable weights than rank 0 "
                           f"({len(names)} against {len(got)})")
    channel.tensors([p for p in learner.model.parameters() if p.requires_grad])
    if rank == 0:
        buf = io.BytesIO()
        torch.save(learner.optimizer_state(), buf)
        channel.bytes(buf.getvalue())
    else:
        device = next(learner.model.parameters()).device
        state = torch.load(io.BytesIO(channel.bytes(None)), map_location=device, weights_only=False)
        learner.optimizer_state_load(state)


@dataclass
class GangPlan:
    """What a learner gang is: ranks in all, over how many hosts, sharded how."""

    world: int
    hosts: int = 1
    sharding: str = "full"

    @property
    def local(self) -> int:
        """Ranks per host (rank 0's host runs ranks 0 … local − 1)."""
        return self.world // self.hosts


class LearnerGang:
    """Rank 0's side of a learner gang: the follower processes it started on its host, the
    channel to every rank, and an unsharded copy of the policy (`whole`) that versions are
    written from. `step` is one update of the whole gang on a batch."""

    def __init__(self, *, learner: Learner | None, run_config: JSONObject, plan: GangPlan, timeout_s: float,
                 whole: torch.nn.Module | None = None, addr: str = "127.0.0.1", port: int = 0, checkpoint: Path | None = None,
                 build: LearnerBuild | None = None) -> None:
        """`learner`: rank 0's, whole, sharded here; None: built here on its shards only once
        the gang is joined, from `build` (workers.algorithms.sharding)."""
        import torch.distributed as dist

        spec = learner.spec if learner is not None else build.spec if build is not None else None
        assert spec is not None, "a learner gang needs rank 0's learner or what to build it from"
        if not objective_class(spec.algorithm).shards():
            raise GangUnsupported(f"trainer.processes: {spec.algorithm} has no sharded objective; set processes: 1")
        self.plan = plan
        self.world = plan.world
        self.backend, _ = gang_backend(plan.local)
        self.whole = whole
        # The followers load only their shards of the model and take rank 0's trainable state
        # into them (`learner_shard` from_rank0), or, rank 0 built on its shards too, agree
        # with it already; sharded `none`, each holds a whole replica.
        self.followers_shard_load = sharded_load_fits(plan.sharding, model=str(run_config.get("model", "")))
        self.rank0_sharded = learner is None
        self.timeout_s = timeout_s
        timeout = datetime.timedelta(seconds=timeout_s)
        # Port 0: the system picks a free one (no race with another gang starting); ranks
        # on other hosts need a fixed one (RFT_LEARNER_PORT).
        store, self.generation, self.port = _store_open("0.0.0.0" if plan.hosts > 1 else addr, port, world=plan.world,
                                                        timeout=timeout)
        self._store: dist.Store | None = store
        # Rank 0's operations so far (each announced in the store as OP + its number).
        self.ops = 0
        # What every rank builds its learner from: read from the store, so a rank on another
        # host needs only the address (`python -m workers.trainer.follower join`).
        store.set("rft/spec", json.dumps({
            "world": plan.world, "hosts": plan.hosts, "sharding": plan.sharding, "timeout_s": timeout_s,
            "config": run_config, "checkpoint": str(checkpoint) if checkpoint else None, "code": code_fingerprint(),
            "sharded_load": self.followers_shard_load, "rank0_sharded": self.rank0_sharded,
            "source": build.source if build is not None else None,  # issue 66.5: a version's weights
            "plugins": plugins_loaded(),
        }))
        # Set when a step failed part-way: the followers may be inside a collective, so they
        # are ended rather than sent a message they would mismatch.
        self.broken = False
        self.followers: list[subprocess.Popen[bytes]] = [
            _follower_start(addr="127.0.0.1", port=self.port, rank=rank, parent=os.getpid(), generation=self.generation)
            for rank in range(1, plan.local)
        ]
        # The processes started, kept after `close` forgets `followers` (to see them end).
        self.followers_started = list(self.followers)
        self.channel: Channel | None = None
        try:
            ranks_await(store, world=plan.world, timeout=timeout, followers=self.followers)
            gang_join(store=store, rank=0, world=plan.world, backend=self.backend, timeout=timeout)
            self.channel = Channel()
            if learner is None:
                assert build is not None
                learner = learner_sharded_build(build, world=plan.world, sharding=plan.sharding)
            self.learner: Learner = learner
            if not self.followers_shard_load:
                state_share(self.channel, learner, rank=0)
            self.shard = learner_shard(learner, rank=0, world=plan.world, sharding=plan.sharding,
                                       from_rank0=self.followers_shard_load and not self.rank0_sharded)
            if checkpoint is not None:
                sharded_load(learner, checkpoint)
        except BaseException as exc:
            # A rank lost while the gang forms is a GangLost too; a rank's refusal is not.
            lost = self._failed(exc, "the gang's start") if is_comm_error(exc) else None
            self.broken = True
            self.close()
            if lost is not None:
                raise lost from exc
            raise
        log.info("learner gang of %s processes over %s host(s) (%s, sharding %s) started: followers %s", plan.world,
                 plan.hosts, self.backend, plan.sharding, [p.pid for p in self.followers])

    def _alive(self) -> None:
        dead = [p.pid for p in self.followers if p.poll() is not None]
        if dead:
            self.broken = True
            raise RuntimeError(f"learner gang: follower process(es) {dead} ended; the gang is restarted")

    def _op(self, msg: GangMessage) -> None:
        self._alive()
        assert self.channel is not None and self._store is not None
        self.ops += 1
        self._store.set(f"{OP}{self.ops}", "go")  # the followers wait for it outside any collective
        self.channel.message(msg)

    def _failed(self, exc: BaseException, doing: str) -> GangLost | None:
        """The gang is broken; where a rank was lost (a collective's transport failed or
        timed out, or a follower ended), the GangLost to raise, naming the ranks whose
        heartbeat stopped and their hosts; None where the step's own code failed."""
        self.broken = True
        dead = [p.pid for p in self.followers if p.poll() is not None]
        if self._store is None or not (dead or is_comm_error(exc)):
            return None
        store = self._store
        silent = ranks_silent(store, world=self.world)
        who = (", ".join(rank_where(store, r) for r in silent) + " stopped answering" if silent
               else "no rank stopped answering, but a collective failed")
        cause = str(exc).split("] ", 1)[-1].split(". ", 1)[0]  # gloo's: "[file:line] What. Advice…"
        log.warning("learner gang: %s during %s", who, doing, exc_info=True)
        return GangLost(f"learner gang: {who} during {doing} (collectives wait at most "
                        f"trainer.collective_timeout_s = {self.timeout_s:g} s): {cause}")

    def step(self, batch: TrainBatch, *, entry: bytes) -> dict[str, float]:
        """One update on `batch` by every rank. `entry`: the batch as the journal encodes it
        (workers.trainer.journal.journal_encode), RNG state included, which is what followers decode."""

        try:
            self.whole_release()
            self._op({"op": "step"})
            assert self.channel is not None
            self.channel.bytes(entry)
            metrics: dict[str, float] = self.learner.step(batch, shard=self.shard)
        except NothingToTrain:
            raise  # decided on the whole batch: every rank skipped together, the gang is in step
        except BaseException as exc:
            lost = self._failed(exc, "a step")
            if lost is not None:
                raise lost from exc
            raise
        metrics["learner_processes"] = float(self.world)
        return metrics

    def whole_model(self) -> torch.nn.Module:
        """The unsharded policy as of the last step (gathered from every rank's shard)."""
        if self.plan.sharding == "none":
            return self.learner.model  # a whole replica already
        try:
            self._op({"op": "whole"})
            state = whole_gather(self.learner)
        except BaseException as exc:
            lost = self._failed(exc, "gathering the policy for a version")
            if lost is not None:
                raise lost from exc
            raise
        assert self.whole is not None, "a sharded learner gang needs its policy's skeleton (whole)"
        return whole_assign(self.whole, state)

    @property
    def streams_versions(self) -> bool:
        """Whether a version can be written from the shards without the whole model in
        rank 0's memory (`version_write`): full weights, sharded."""
        return self.whole is not None and self.plan.sharding != "none" and not self.learner.adapter

    def version_write(self, out: Path) -> int:
        """A full-weight version's model files in the directory `out`: the weights gathered
        one tensor at a time and written at once (rank 0 holds one whole tensor at most,
        where `whole_model` holds them all until the next step), the config and generation
        settings from the policy's skeleton. Returns the weight bytes written."""
        from transformers import PreTrainedModel

        skeleton = self.whole
        assert isinstance(skeleton, PreTrainedModel) and self.streams_versions, "versions stream from full weights, sharded"
        try:
            self._op({"op": "whole"})
            size = whole_write(self.learner, out / "model.safetensors")
        except BaseException as exc:
            lost = self._failed(exc, "writing a version")
            if lost is not None:
                raise lost from exc
            raise
        # As save_pretrained writes them: the weights' dtype and the class in the config.
        skeleton.config.dtype = str(skeleton.dtype).split(".")[1]
        skeleton.config.architectures = [type(skeleton).__name__]
        skeleton.config.save_pretrained(out)
        if skeleton.can_generate() and skeleton.generation_config is not None:
            skeleton.generation_config.save_pretrained(out)
        return size

    def whole_release(self) -> None:
        """Let go of the whole weights `whole_model` gathered (the policy's skeleton stays)."""
        if self.whole is not None and self.plan.sharding != "none":
            whole_release(self.whole)

    def save(self, path: Path) -> None:
        """A sharded checkpoint at `path` (each rank writes its shard)."""
        try:
            self.whole_release()
            self._op({"op": "save", "path": str(path)})
            sharded_save(self.learner, path)
        except BaseException as exc:
            lost = self._failed(exc, "a snapshot")
            if lost is not None:
                raise lost from exc
            raise

    def close(self) -> None:
        """Tell the followers to end (they also end on their own if this process dies), and
        leave the process group."""
        import torch.distributed as dist

        if self.channel is not None and not self.broken and all(p.poll() is None for p in self.followers):
            try:
                self._op({"op": "stop"})
            except Exception:
                self.broken = True
                log.warning("learner gang: could not tell the followers to stop; ending them", exc_info=True)
        if self.broken and self._store is not None:
            try:  # a rank waiting for the next operation (not in a collective) ends on this
                self._store.set(f"{OP}{self.ops + 1}", "abort")
            except Exception:
                log.warning("learner gang: could not tell the other ranks it is given up", exc_info=True)
        for p in self.followers:
            if self.broken:
                # It has nothing to finish, and may be stopped or stuck in a collective: a
                # stopped process would not act on SIGTERM before FOLLOWER_EXIT_S.
                p.kill()
            try:
                p.wait(timeout=FOLLOWER_EXIT_S)
            except subprocess.TimeoutExpired:
                log.warning("learner gang: follower %s had not ended %.0f s after it was told to; killing it", p.pid,
                            FOLLOWER_EXIT_S)
                p.kill()
                p.wait()
        self.followers = []
        self.channel = None
        if dist.is_initialized():
            dist.destroy_process_group()
        self._store = None  # (a fixed port's store server stays: the next gang is a generation in it)


# Rank 0's store on a fixed port (RFT_LEARNER_PORT, which other hosts' ranks are told), by
# address and port: the train worker's for as long as it lives. Each gang is a generation in
# it (GENERATION counts them; a gang's keys are under "rft/g<N>/"): the gang re-formed after a
# lost rank cannot bind the port again at once, since its store listens until its last reference
# goes, and a broken gang's references sit in reference cycles (the model's sharding state).
_STORES: dict[tuple[str, int], dist.TCPStore] = {}
_STORES_LOCK = threading.Lock()
GENERATION = "rft/generation"


def _store_open(addr: str, port: int, *, world: int, timeout: datetime.timedelta) -> tuple[dist.Store, int, int]:
    """A new gang's store in rank 0's store server (a fresh server on port 0: the system picks
    a free port, no race with another gang starting), its generation number and the port."""
    import torch.distributed as dist

    with _STORES_LOCK:
        base = _STORES.get((addr, port)) if port else None
        if base is None:
            base = dist.TCPStore(addr, port, world, is_master=True, timeout=timeout, wait_for_workers=False)
            if port:
                _STORES[(addr, port)] = base
    generation = int(base.add(GENERATION, 1))
    return dist.PrefixStore(f"rft/g{generation}", base), generation, int(base.port)



def _follower_start(*, addr: str, port: int, rank: int, parent: int, generation: int) -> subprocess.Popen[bytes]:
    # From the project's root (`-m` puts it on the path), whatever the worker's directory.
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return subprocess.Popen([sys.executable, "-m", FOLLOWER_MODULE, "rank", addr, str(port), str(rank),
                             str(parent), str(generation)], cwd=root, close_fds=True)



def host_join(*, addr: str, port: int, host: int) -> int:
    """Another host's part of a learner gang (trainer.hosts > 1): read the gang's plan from
    rank 0's store at addr:port, run this host's ranks (host × local … + local − 1), one
    process each, until they end; returns the first failing one's exit status (0: all ended
    cleanly)."""
    store, generation = dist_store(addr, port)
    plan_in = json.loads(store.get("rft/spec"))
    try:
        code_check(plan_in, where=f"host {host}")
    except GangUnsupported as exc:
        refusal_set(store, exc, where=f"host {host}")
        raise
    plan = GangPlan(world=int(plan_in["world"]), hosts=int(plan_in["hosts"]), sharding=str(plan_in["sharding"]))
    # Not a refusal: a host numbered outside the gang is not one rank 0 waits for.
    if not 0 < host < plan.hosts:
        raise GangUnsupported(f"host {host}: the learner gang at {addr}:{port} has hosts 1 to {plan.hosts - 1} to join")
    beat_start(addr=addr, port=port, generation=generation, host=host)
    ranks = [_follower_start(addr=addr, port=port, rank=rank, parent=os.getpid(), generation=generation)
             for rank in range(host * plan.local, (host + 1) * plan.local)]
    codes = [p.wait() for p in ranks]
    return next((c for c in codes if c), 0)


def dist_store(addr: str, port: int, generation: int | None = None) -> tuple[dist.Store, int]:
    """A client of rank 0's store at addr:port, in gang `generation` (None: the newest, for
    another host's `join`), and that generation."""
    import torch.distributed as dist

    base = dist.TCPStore(addr, port, is_master=False, timeout=datetime.timedelta(seconds=600))
    if generation is None:
        base.wait([GENERATION])
        generation = int(base.get(GENERATION))
    return dist.PrefixStore(f"rft/g{generation}", base), generation


