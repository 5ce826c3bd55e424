"""A learner as a group of processes (torch.distributed: gloo on CPU, NCCL on GPUs).

Data parallel, as DDP does it, made explicit so that the update is exactly the one-process
update on the whole batch: every rank holds the same policy and optimizer; each takes its
part of the batch (GRPO: whole groups, so group-relative advantages are unchanged; SFT:
rows), computes the algorithm's loss on it weighted by the part's share of the whole
batch's normaliser, and the gradients are summed over the group (all-reduce) before
clipping and the optimizer step, which then agree on every rank.

The share depends on how TRL normalises each loss: per sequence (grpo, dr_grpo: the share
of sequences) or per token (dapo, bnpo, SFT: the share of completion tokens). Loss types
whose normaliser does not split that way (cispo, sapo, luspo, vespo), batch-scaled rewards,
MIX and DPO are refused with a message rather than trained on a different objective.

`LearnerGroup` is how a train worker runs a run's learner that way (`trainer.processes`
> 1): its own process is rank 0 and keeps everything the trainer does (claims, journal,
commits, checkpoints); it starts `processes - 1` follower processes on its host
(`python -m workers.algorithms.distributed`), each holding the same policy and optimizer
on its own device (cuda:rank with NCCL where the host has a GPU per process, else the CPU
with gloo). Rank 0 sends them its whole trainable state once (weights and optimizer, so a
resumed or replayed learner starts identical everywhere), then each step's batch (the
journal entry, with the RNG state it starts from); every rank trains on its part and the
gradients are summed before the same update. The parameters are replicated, so rank 0's
copy is the whole model: checkpoints, published versions and snapshots are written by rank
0 alone, in the one place they always were. The group has its own process group (not the
default one, which `workers.sync.NcclSync` may hold in the same process). A follower ends
when rank 0 closes the group or its parent process goes away.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from apps.runs.config import learner_group_refusal
from workers.algorithms.batch import Rollout, TrainBatch

log = logging.getLogger(__name__)


class GroupUnsupported(ValueError):
    """This algorithm or loss cannot be split over a learner group exactly."""


def group_supported(spec: Any) -> str | None:
    """None when a learner with `spec` can run as a group, else why not."""
    return learner_group_refusal(algorithm=spec.algorithm, loss_type=spec.params.loss_type,
                                 scale_rewards=spec.params.scale_rewards)


def _parts(rows: list[Rollout], world: int, *, by_group: bool) -> list[list[Rollout]]:
    """Deal rows (whole groups when by_group) round-robin to `world` parts, in batch order."""
    parts: list[list[Rollout]] = [[] for _ in range(world)]
    if not by_group:
        for i, row in enumerate(rows):
            parts[i % world].append(row)
        return parts
    order: list[str] = []
    groups: dict[str, list[Rollout]] = {}
    for row in rows:
        if row.group_id not in groups:
            order.append(row.group_id)
        groups.setdefault(row.group_id, []).append(row)
    for i, gid in enumerate(order):
        parts[i % world].extend(groups[gid])
    return parts


@dataclass
class GroupShard:
    """This process's place in a learner group: rank of world, and the process group."""

    rank: int
    world: int
    group: Any = None
    last_share: float = field(default=0.0, init=False)
    # Why this rank's part had nothing to learn from ("" when it had something).
    nothing: str = field(default="", init=False)

    def _rows(self, learner: Any, batch: TrainBatch) -> tuple[list[Rollout], list[Rollout]]:
        """(all rows the algorithm trains on, this rank's part)."""
        spec = learner.spec
        reason = group_supported(spec)
        if reason is not None:
            raise GroupUnsupported(reason)
        rows, by_group = learner.objective.group_rows(batch)
        return rows, _parts(rows, self.world, by_group=by_group)[self.rank]

    def loss(self, learner: Any, batch: TrainBatch) -> tuple[torch.Tensor, dict[str, float]]:
        from workers.algorithms.learner import NothingToTrain

        rows, mine = self._rows(learner, batch)
        self.nothing = "" if mine else "no rollout with a token to learn from"
        if mine:
            share = self.last_share = learner.objective.group_share(learner, rows, mine)
            part = learner.objective.group_part(mine)
            try:
                loss, metrics = learner.loss(part)
                return loss * share, metrics
            except NothingToTrain as exc:
                # Every rank must still join the all-reduce; whether anyone trained is
                # decided there (`reduce`), so all ranks skip the update together.
                self.nothing = str(exc)
        # More ranks than groups, or nothing to learn in this part: this rank adds nothing.
        self.last_share = 0.0
        zero = sum(p.sum() * 0.0 for p in learner.trainable_parameters)
        return zero, {}

    def reduce(self, *, params: list[torch.nn.Parameter], loss: torch.Tensor) -> torch.Tensor:
        """Sum the gradients (and the weighted losses, for the metric) over the group."""
        import torch.distributed as dist

        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        # One flat buffer: one collective instead of one per tensor.
        # Plus the loss and a count of ranks that had something to learn from.
        trained = torch.ones(1) if not self.nothing else torch.zeros(1)
        flat = torch.cat([p.grad.reshape(-1) for p in params]
                         + [loss.detach().reshape(1).to(params[0].grad), trained.to(params[0].grad)])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=self.group)
        if float(flat[-1]) == 0:
            from workers.algorithms.learner import NothingToTrain

            raise NothingToTrain(self.nothing or "no rank of the learner group had anything to learn from")
        offset = 0
        for p in params:
            n = p.grad.numel()
            p.grad.copy_(flat[offset : offset + n].view_as(p.grad))
            offset += n
        return flat[offset]


# ----------------------------------------------------------------------------- a group of processes


def _process_group(*, store: Any, rank: int, world: int, backend: str, timeout: datetime.timedelta) -> Any:
    """A process group of its own (not registered as the default): collectives take it as
    `group=`, broadcasts name the source with `group_src`."""
    import torch.distributed as dist

    if backend == "gloo":
        return dist.ProcessGroupGloo(store, rank, world, timeout)
    options = dist.ProcessGroupNCCL.Options()
    options._timeout = timeout
    return dist.ProcessGroupNCCL(store, rank, world, options)


def group_backend(world: int) -> tuple[str, str]:
    """(backend, rank 0's device) for a group of `world` processes on this host: NCCL with a
    GPU per process, gloo on the CPU where there is no GPU; a host with GPUs, but fewer than
    processes, is refused (NCCL will not put two ranks on one GPU)."""
    if not torch.cuda.is_available():
        return "gloo", "cpu"
    if torch.cuda.device_count() < world:
        raise GroupUnsupported(f"trainer.processes: {world} learner processes need {world} GPUs on the train "
                               f"worker's host; it has {torch.cuda.device_count()}")
    return "nccl", "cuda:0"


class _Channel:
    """Bytes and tensors from rank 0 to the other ranks of a group."""

    def __init__(self, group: Any, device: str) -> None:
        self.group = group
        self.device = device

    def bytes(self, data: bytes | None) -> bytes:
        import torch.distributed as dist

        size = torch.tensor([len(data) if data is not None else 0], dtype=torch.int64, device=self.device)
        dist.broadcast(size, group=self.group, group_src=0)
        if data is not None:
            buf = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(self.device) if data else torch.empty(0, dtype=torch.uint8, device=self.device)
        else:
            buf = torch.empty(int(size.item()), dtype=torch.uint8, device=self.device)
        dist.broadcast(buf, group=self.group, group_src=0)
        return data if data is not None else bytes(buf.cpu().numpy().tobytes())

    def message(self, msg: dict[str, Any] | None = None) -> dict[str, Any]:
        out: dict[str, Any] = json.loads(self.bytes(json.dumps(msg).encode() if msg is not None else None))
        return out

    def tensors(self, tensors: list[torch.Tensor]) -> None:
        """Rank 0 sends, the others receive into, tensors of the same shapes (in place)."""
        import torch.distributed as dist

        for t in tensors:
            buf = t.detach() if t.device.type == torch.device(self.device).type else t.detach().to(self.device)
            dist.broadcast(buf, group=self.group, group_src=0)
            if buf is not t:
                with torch.no_grad():
                    t.copy_(buf)


def _state_names(learner: Any) -> list[str]:
    return [n for n, p in learner.model.named_parameters() if p.requires_grad]


def state_share(channel: _Channel, learner: Any, *, rank: int) -> None:
    """Make every rank's trainable weights and optimizer state rank 0's (a frozen base is
    the run's model on every rank already)."""
    import io

    names = _state_names(learner)
    got = channel.message({"names": names} if rank == 0 else None)["names"]
    if got != names:
        raise RuntimeError(f"learner group: rank {rank} holds other trainable weights than rank 0 "
                           f"({len(names)} against {len(got)})")
    channel.tensors([p for p in learner.model.parameters() if p.requires_grad])
    if rank == 0:
        buf = io.BytesIO()
        torch.save(learner.optimizer_state(), buf)
        channel.bytes(buf.getvalue())
    else:
        state = torch.load(io.BytesIO(channel.bytes(None)), map_location=channel.device, weights_only=False)
        learner.optimizer_state_load(state)


class LearnerGroup:
    """Rank 0's side of a learner group: the follower processes it started and the channel
    to them. `step` is one update of the whole group on a batch."""

    def __init__(self, *, learner: Any, run_config: dict[str, Any], world: int, timeout_s: float) -> None:
        import torch.distributed as dist

        reason = group_supported(learner.spec)
        if reason is not None:
            raise GroupUnsupported(f"trainer.processes: {reason}")
        self.world = world
        self.backend, device = group_backend(world)
        self.learner = learner
        timeout = datetime.timedelta(seconds=timeout_s)
        # Port 0: the system picks a free one (no race with another group starting).
        self._store = dist.TCPStore("127.0.0.1", 0, world, is_master=True, timeout=timeout, wait_for_workers=False)
        port = self._store.port
        # Set when a step failed part-way: the followers may be inside a collective, so they
        # are ended rather than sent a message they would mismatch.
        self.broken = False
        # From the project's root (`-m` puts it on the path), whatever the worker's directory.
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        spec = json.dumps({
            "port": port, "world": world, "backend": self.backend, "timeout_s": timeout_s, "config": run_config,
            "parent": os.getpid(),
        })
        self.followers: list[subprocess.Popen[bytes]] = []
        for rank in range(1, world):
            self.followers.append(subprocess.Popen(
                [sys.executable, "-m", "workers.algorithms.distributed", str(rank), spec], cwd=root, close_fds=True,
            ))
        # The processes started, kept after `close` forgets `followers` (to see them end).
        self.followers_started = list(self.followers)
        try:
            self.group = _process_group(store=self._store, rank=0, world=world, backend=self.backend, timeout=timeout)
            self.channel = _Channel(self.group, device)
            state_share(self.channel, learner, rank=0)
        except BaseException:
            self.close()
            raise
        log.info("learner group of %s processes (%s) started: followers %s", world, self.backend,
                 [p.pid for p in self.followers])

    def step(self, batch: TrainBatch, *, entry: bytes) -> dict[str, float]:
        """One update on `batch` by every rank. `entry`: the batch as the journal encodes it
        (workers.trainer.journal_encode), RNG state included, which is what followers decode."""
        dead = [p.pid for p in self.followers if p.poll() is not None]
        if dead:
            raise RuntimeError(f"learner group: follower process(es) {dead} ended; the group is restarted")
        from workers.algorithms.learner import NothingToTrain

        try:
            self.channel.message({"op": "step"})
            self.channel.bytes(entry)
            metrics: dict[str, float] = self.learner.step(batch, shard=GroupShard(rank=0, world=self.world, group=self.group))
        except NothingToTrain:
            raise  # every rank skipped together: the group is in step
        except BaseException:
            self.broken = True
            raise
        metrics["learner_processes"] = float(self.world)
        return metrics

    def close(self) -> None:
        """Tell the followers to end (they also end on their own if this process dies)."""
        if getattr(self, "channel", None) is not None and not self.broken and all(p.poll() is None for p in self.followers):
            try:
                self.channel.message({"op": "stop"})
            except Exception:
                log.warning("learner group: could not tell the followers to stop; ending them", exc_info=True)
        for p in self.followers:
            if self.broken:
                p.terminate()
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.followers = []
        self.channel = None  # type: ignore[assignment]


def _orphan_watch(parent: int) -> None:
    """End this follower when rank 0's process is gone (killed worker, crashed task)."""
    def watch() -> None:
        while True:
            if os.getppid() != parent:
                os._exit(3)
            time.sleep(1.0)

    threading.Thread(target=watch, name="learner-group-parent", daemon=True).start()


def follower_main(rank: int, spec_json: str) -> None:
    """A follower: build the run's learner as rank 0 did, take rank 0's state, then train
    on every batch it sends until told to stop."""
    import django

    spec_in = json.loads(spec_json)
    _orphan_watch(int(spec_in["parent"]))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "rftweb.settings")
    django.setup()
    import torch.distributed as dist

    from apps.runs.config import config_validate
    from workers.algorithms import Learner, NothingToTrain, spec_from_config
    from workers.trainer import _policy_load, _rng_restore, journal_decode

    world, backend = int(spec_in["world"]), str(spec_in["backend"])
    device = "cpu"
    if backend == "nccl":
        torch.cuda.set_device(rank)
        device = f"cuda:{rank}"
    timeout = datetime.timedelta(seconds=float(spec_in["timeout_s"]))
    store = dist.TCPStore("127.0.0.1", int(spec_in["port"]), world, is_master=False, timeout=timeout)
    cfg = config_validate(data=spec_in["config"])
    torch.manual_seed(cfg.seed)
    from transformers import AutoTokenizer

    spec = spec_from_config(cfg)
    tokenizer = AutoTokenizer.from_pretrained(cfg.tokenizer or cfg.model)
    model, ref_model = _policy_load(cfg=cfg, spec=spec, source=cfg.model)
    learner = Learner(spec=spec, model=model, tokenizer=tokenizer, ref_model=ref_model)
    group = _process_group(store=store, rank=rank, world=world, backend=backend, timeout=timeout)
    channel = _Channel(group, device)
    state_share(channel, learner, rank=rank)
    shard = GroupShard(rank=rank, world=world, group=group)
    while True:
        msg = channel.message()
        if msg.get("op") == "stop":
            return
        batch, rng = journal_decode(channel.bytes(None))
        _rng_restore(rng)
        try:
            learner.step(batch, shard=shard)
        except NothingToTrain:
            pass  # every rank skipped this update together (GroupShard.reduce)


if __name__ == "__main__":
    follower_main(int(sys.argv[1]), sys.argv[2])
