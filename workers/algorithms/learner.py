"""One resident policy trained by any registered algorithm, with TRL computing every loss.

A `Learner` owns what every algorithm shares: the policy, the reference model when the
algorithm needs one, the precision, one optimizer over the policy's parameters and the
update step. The algorithm's objective (workers/algorithms/objectives/<name>.py, built
once per learner) owns the TRL trainers it borrows `compute_loss` from, its inputs and its
loss. `loss(batch)` is the objective on one batch; `step(batch)` is one update.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from workers.algorithms import trl_bridge as bridge
from workers.algorithms.batch import Rollout, TrainBatch
from workers.algorithms.trainee import LearnerSpec, NothingToTrain

from workers.algorithms.objectives import objective_class
from workers.weights.adapters import is_adapter_model
from workers.host_memory import backward_trim
from workers.precision import autocast, optimizer_check, precision_check
from workers.vision import images_open, pixel_inputs

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase, ProcessorMixin

    from kernel.config import RunConfig


# The model's blocks and a rank's Shard live with the learner, which trims the heap block by
# block and steps on its shard; workers/algorithms/sharding.py, which shards a learner, builds
# on them.
def model_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's repeated blocks (transformers' `_no_split_modules`: the decoder layers),
    outermost only (a vision tower's layers inside a listed module stay in it)."""
    names: set[str] = set()
    for module in model.modules():
        names.update(getattr(module, "_no_split_modules", None) or ())
    blocks = [m for m in model.modules() if type(m).__name__ in names]
    inner = {id(c) for b in blocks for c in b.modules() if c is not b}
    return [b for b in blocks if id(b) not in inner]


@dataclass
class Shard:
    """This process's place in a learner gang: rank of world."""

    rank: int
    world: int
    sharding: str = "full"
    # The rank's weighted loss term of the last step (its share of the batch's loss).
    last_term: float = field(default=0.0, init=False)

    def loss(self, learner: Learner, batch: TrainBatch) -> tuple[torch.Tensor, dict[str, float]]:
        loss, metrics = learner.objective.shard_loss(batch, rank=self.rank, world=self.world)
        self.last_term = float(loss.detach())
        # FSDP2 and DDP average the gradients over the ranks; the terms are to be summed.
        return loss * self.world, metrics

    def reduce(self, loss: torch.Tensor) -> torch.Tensor:
        """The whole batch's loss (the metric): the ranks' terms summed."""
        import torch.distributed as dist

        total = (loss.detach() / self.world).reshape(1).float().to(_comm_device())
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
        return total[0]


def _comm_device() -> str:
    """Where this process's collectives' tensors live (NCCL takes GPU tensors only)."""
    import torch.distributed as dist

    if dist.get_backend() == "nccl":
        return f"cuda:{torch.cuda.current_device()}"
    return "cpu"


# Step metric: 1.0 when the batch had no gradient and the optimizer did not step
# (Learner.no_gradient), 0.0 when it stepped. Recorded on every step so the run page charts it.
# The stored metric keeps its old name (runs' charts and the benches read it).
SKIPPED_NO_GRADIENT = "train/skipped_no_signal"


def spec_from_config(cfg: RunConfig) -> LearnerSpec:
    """From a `kernel.config.RunConfig` (pydantic: workers take no Django types here)."""
    t = cfg.trainer
    params = bridge.TrainParams(
        learning_rate=t.learning_rate,
        max_grad_norm=t.max_grad_norm,
        max_completion_length=cfg.sampling.max_tokens,
        total_steps=cfg.total_steps,
        seed=cfg.seed,
    )
    return LearnerSpec(
        algorithm=str(cfg.algorithm), params=params, algorithm_params=t.params, precision=t.precision,
        gradient_checkpointing=t.gradient_checkpointing, lora=t.lora, optimizer=t.optimizer,
    )


class Learner:
    def __init__(self, *, spec: LearnerSpec, model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase,
                 ref_model: torch.nn.Module | None = None, processor: ProcessorMixin | None = None) -> None:
        objective = objective_class(spec.algorithm)  # ValueError naming the known ones

        self.adapter = is_adapter_model(model)
        if spec.needs_ref and ref_model is None and not self.adapter:
            raise ValueError(f"{spec.algorithm} with these settings needs a reference model")
        self.device = next(model.parameters()).device.type
        precision_check(spec.precision, device=self.device)
        # Peak memory of a CPU step: small logprob tiles (trl_bridge says why); nothing
        # changes on a GPU. Returning freed tensors to the system is the train worker's
        # choice (RFT_TRAINER_CPU_MMAP_THRESHOLD, workers/host_memory.py): it costs time.
        bridge.fused_head_tiles_for(next(model.parameters()).device)
        if self.device == "cpu":
            # In a tuned worker, the heap is also trimmed after each block's backward.
            backward_trim(model_blocks(model))
        optimizer_check(spec.optimizer, device=self.device)
        self.spec = spec
        self.model = model
        # What the losses call: the model itself, or its DistributedDataParallel wrapper in a
        # learner gang sharded `none` (FSDP2 shards the model in place).
        self.forward_model: torch.nn.Module = model
        self.tokenizer = tokenizer
        # A vision-language model's processor: the pictures of image prompts become pixel inputs.
        self.processor = processor
        # With an adapter the reference is the base itself (adapter off), never a copy.
        self.ref_model = None if self.adapter else ref_model
        if self.ref_model is not None:
            self.ref_model.eval()
            self.ref_model.requires_grad_(False)
        if spec.gradient_checkpointing:
            # Non-reentrant: works with frozen inputs (a LoRA base) without input grads.
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            model.config.use_cache = False
        # The objective builds the TRL trainers it borrows its loss from.
        self.objective = objective(self)
        if self.adapter:
            # TRL keeps a frozen copy of a pre-existing adapter as the reference; ours is
            # the base (a resumed adapter's copy would be the trained one, not the start).
            bridge.reference_adapter_drop(model)
        self.optimizer_rebuild()
        self.scaler = torch.amp.GradScaler(self.device) if spec.precision == "fp16" else None
        self.model.train()

    def optimizer_rebuild(self) -> None:
        """A fresh optimizer and scheduler over the model's parameters as they are now (FSDP2
        replaces them with their shards: workers.algorithms.sharding.learner_shard)."""
        primary = self.objective.trainer
        primary.optimizer = None
        primary.lr_scheduler = None
        self.optimizer, self.scheduler = bridge.optimizer_build(trainer=primary, total_steps=self.spec.params.total_steps,
                                                                optimizer=self.spec.optimizer)

    @property
    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    # -- what the objectives share -------------------------------------------------

    def pixel_inputs(self, rollouts: list[Rollout]) -> dict[str, torch.Tensor | list[int]]:
        """The pictures of image prompts as the model's pixel inputs, TRL's way (`pixel_values`
        and the processor's other tensors, `num_images` per row); nothing for text rollouts."""
        pictured = [bool(r.images) for r in rollouts]
        if not any(pictured):
            return {}
        if not all(pictured):
            raise ValueError("a batch mixes prompts with and without images; the trainer takes one kind per batch")
        if self.processor is None:
            raise ValueError("rollouts with images need a vision-language model (its processor)")

        pixels = pixel_inputs(self.processor, [images_open(r.images or []) for r in rollouts])
        device = next(self.model.parameters()).device
        out: dict[str, torch.Tensor | list[int]] = {k: v.to(device) for k, v in pixels.items()}
        out["num_images"] = [len(r.images or []) for r in rollouts]
        return out

    @contextmanager
    def reference(self) -> Iterator[torch.nn.Module]:
        """The KL reference to score with: the reference model, or with an adapter the same
        model with the adapter switched off (for as long as the block lasts)."""
        if self.adapter:
            with self.model.disable_adapter():
                yield self.model
            return
        assert self.ref_model is not None, f"{self.spec.algorithm} with these settings has no reference model"
        yield self.ref_model

    def loss(self, batch: TrainBatch) -> tuple[torch.Tensor, dict[str, float]]:
        """The algorithm's objective on `batch`, with the metrics TRL logged computing it."""
        return self.objective.loss(batch)

    # -- one update -------------------------------------------------------------------

    def no_gradient(self, batch: TrainBatch) -> str | None:
        """Why `batch` cannot move the weights (None: it can, or only the loss can tell).

        AdamW would still move them on such a batch: its momentum replays earlier
        gradients and its weight decay shrinks every weight, so a run fed batches without
        gradient (a reward model's fallback scoring every member alike, a rater budget that
        leaves whole groups tied) drifts with nothing to learn. `step` then skips the update.
        Decided on the whole batch, before any learner-gang shard, so every rank agrees.
        TRL's own trainers do not skip (they step on whatever the batch gives)."""
        return self.objective.no_gradient(batch)

    def _batch_metrics(self, batch: TrainBatch) -> dict[str, float]:
        rows = batch.usual + batch.expert
        metrics = {
            "learning_rate": float(self.optimizer.param_groups[0]["lr"]),
            "batch_size": float(len(rows)),
            "expert_count": float(len(batch.expert)),
            # What the model wrote: environment tokens and masked responses count for nothing.
            "response_length": sum(r.action_count for r in rows) / max(1, len(rows)),
            "action_tokens": float(sum(r.action_count for r in rows)),
        }
        rewards = [float(r.reward) for r in rows if r.reward is not None]
        if rewards:
            mean = sum(rewards) / len(rewards)
            metrics["reward_mean"] = mean
            metrics["reward_std"] = math.sqrt(sum((x - mean) ** 2 for x in rewards) / len(rewards))
        return metrics

    def step(self, batch: TrainBatch, *, shard: Shard | None = None) -> dict[str, float]:
        """One optimizer step on `batch`; returns the step's metrics.

        shard: this process's place in a learner gang (`Shard`, above):
        the loss is this rank's term of the whole batch's objective (its part of the rows,
        weighted by the part's share), and PyTorch's FSDP2 (or DDP) reduces the gradients
        over the gang in the backward pass, before the same clipping and update.

        A batch without gradient (`no_gradient`) leaves the weights, the optimizer's
        state and the scheduler exactly as they were, and says so in SKIPPED_NO_GRADIENT."""
        started = time.perf_counter()
        if self.no_gradient(batch) is not None:
            return {**self._batch_metrics(batch), SKIPPED_NO_GRADIENT: 1.0, "update_seconds": time.perf_counter() - started}
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)

        with bridge.TRL_STATE_LOCK, autocast(self.spec.precision, device=self.device):
            loss, metrics = self.loss(batch) if shard is None else shard.loss(self, batch)
        params = self.trainable_parameters
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
            self.scaler.unscale_(self.optimizer)
        else:
            loss.backward()
        if shard is not None:
            loss = shard.reduce(loss)
        grad_norm = torch.nn.utils.clip_grad_norm_(params, self.spec.params.max_grad_norm)
        if hasattr(grad_norm, "full_tensor"):  # sharded gradients: the norm is a DTensor
            grad_norm = grad_norm.full_tensor()
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        seconds = time.perf_counter() - started
        rows = batch.usual + batch.expert
        tokens = sum(len(r.prompt_ids) + len(r.completion_ids) for r in rows)
        metrics.update(self._batch_metrics(batch))
        metrics.update(
            {
                "loss": float(loss.detach()),
                "grad_norm": float(grad_norm),
                "tokens_per_second": tokens / seconds if seconds > 0 else 0.0,
                "update_seconds": seconds,
                SKIPPED_NO_GRADIENT: 0.0,
            }
        )
        return metrics

    # -- state ------------------------------------------------------------------------

    def optimizer_state(self) -> dict[str, object]:
        return {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
        }

    def optimizer_state_load(self, state: dict[str, object]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scheduler is not None and state.get("scheduler") is not None:
            self.scheduler.load_state_dict(state["scheduler"])
