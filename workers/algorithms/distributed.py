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

What is not here yet: the trainer task does not start such a group itself (a run's learner
is one process on its worker); this is the step it would run, tested on CPU with gloo.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from workers.algorithms.batch import Rollout, TrainBatch, trainable

PER_SEQUENCE = ("grpo", "dr_grpo")
PER_TOKEN = ("dapo", "bnpo")


class GroupUnsupported(ValueError):
    """This algorithm or loss cannot be split over a learner group exactly."""


def group_supported(spec: Any) -> str | None:
    """None when a learner with `spec` can run as a group, else why not."""
    if spec.algorithm == "sft":
        return None
    if spec.algorithm != "grpo":
        return f"a learner group trains grpo and sft; {spec.algorithm} runs in one process"
    if spec.params.loss_type not in PER_SEQUENCE + PER_TOKEN:
        return f"loss_type {spec.params.loss_type} does not split exactly over a learner group; use one of {', '.join(PER_SEQUENCE + PER_TOKEN)}"
    if spec.params.scale_rewards == "batch":
        return "scale_rewards=batch needs the whole batch's statistics on every rank; use group or none"
    return None


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

    def _rows(self, learner: Any, batch: TrainBatch) -> tuple[list[Rollout], list[Rollout]]:
        """(all rows the algorithm trains on, this rank's part)."""
        spec = learner.spec
        reason = group_supported(spec)
        if reason is not None:
            raise GroupUnsupported(reason)
        if spec.algorithm == "sft":
            rows = trainable(batch.expert + batch.usual)
            return rows, _parts(rows, self.world, by_group=False)[self.rank]
        rows = trainable(batch.usual)
        return rows, _parts(rows, self.world, by_group=True)[self.rank]

    def _share(self, learner: Any, rows: list[Rollout], mine: list[Rollout]) -> float:
        per_sequence = learner.spec.algorithm == "grpo" and learner.spec.params.loss_type in PER_SEQUENCE
        if per_sequence:
            return len(mine) / len(rows)
        return sum(len(r.completion_ids) for r in mine) / sum(len(r.completion_ids) for r in rows)

    def loss(self, learner: Any, batch: TrainBatch) -> tuple[torch.Tensor, dict[str, float]]:
        rows, mine = self._rows(learner, batch)
        if not mine:
            # More ranks than groups: this rank adds nothing but still joins the all-reduce.
            self.last_share = 0.0
            zero = sum(p.sum() * 0.0 for p in learner.trainable_parameters)
            return zero, {}
        share = self.last_share = self._share(learner, rows, mine)
        part = TrainBatch(usual=mine) if learner.spec.algorithm == "grpo" else TrainBatch(expert=mine)
        loss, metrics = learner.loss(part)
        return loss * share, metrics

    def reduce(self, *, params: list[torch.nn.Parameter], loss: torch.Tensor) -> torch.Tensor:
        """Sum the gradients (and the weighted losses, for the metric) over the group."""
        import torch.distributed as dist

        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        # One flat buffer: one collective instead of one per tensor.
        flat = torch.cat([p.grad.reshape(-1) for p in params] + [loss.detach().reshape(1).to(params[0].grad.dtype)])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=self.group)
        offset = 0
        for p in params:
            n = p.grad.numel()
            p.grad.copy_(flat[offset : offset + n].view_as(p.grad))
            offset += n
        return flat[offset]
