"""What the trainer trains on, built from buffer experiences; no TRL here.

An experience stores prompt and response as one `token_ids` list split at `prompt_length`,
with the rollout's per-token logprobs for the response part and, for multi-turn
trajectories, an action mask over the response: 1 where the model sampled the token, 0 where
the environment (a tool's output, a user turn) or the pipeline (a truncated response) put it.
Only action tokens are trained on; the others are context.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from workers.engines.base import prompt_ids

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Rollout:
    id: int
    group_id: str
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float] | None = None
    reward: float | None = None
    is_expert: bool = False
    model_version: int = 0
    # One 0/1 per completion token; None: every token is the model's own.
    action_mask: list[int] | None = None
    # Digests of the pictures the prompt showed (apps/buffer/images.py), in prompt order.
    images: list[str] | None = None

    @property
    def trained_mask(self) -> list[int]:
        """1 for each completion token the loss sees, 0 for context the model did not write."""
        if self.action_mask is None:
            return [1] * len(self.completion_ids)
        return [1 if m else 0 for m in self.action_mask]

    @property
    def action_count(self) -> int:
        return sum(self.trained_mask)


def rollout_from_experience(exp: Any, *, tokenizer: PreTrainedTokenizerBase | None = None) -> Rollout:
    """An `apps.buffer.models.Experience` (or anything with its fields) as a Rollout.

    Text-only experiences (human corrections: the web side has no tokenizer) are tokenised
    here with `tokenizer`, the prompt through the chat template as the explorer renders it
    and the response closed by EOS as a sampled one is; without a tokenizer they stay empty.
    """
    tokens = list(exp.token_ids or [])
    cut = int(exp.prompt_length or 0)
    if not tokens and tokenizer is not None and getattr(exp, "response_text", None):
        tokens, cut = _tokenise_text(exp, tokenizer)
    logprobs = list(exp.logprobs) if exp.logprobs is not None else None
    mask = getattr(exp, "action_mask", None)
    completion_length = len(tokens) - cut
    if mask is not None and len(mask) != completion_length:
        # experience_write refuses this shape; a row that has it anyway is trained on nowhere
        # rather than guessed at (or failing the whole step).
        log.warning("experience %s: action_mask has %d entries for %d response tokens; none trained on",
                    exp.pk, len(mask), completion_length)
        mask = [0] * completion_length
    return Rollout(
        id=int(exp.pk),
        group_id=str(exp.group_id),
        prompt_ids=tokens[:cut],
        completion_ids=tokens[cut:],
        logprobs=logprobs,
        reward=exp.reward,
        is_expert=bool(exp.is_expert),
        model_version=int(exp.model_version or 0),
        action_mask=[int(bool(m)) for m in mask] if mask is not None else None,
        images=list((getattr(exp, "metadata", None) or {}).get("images") or []) or None,
    )


def _tokenise_text(exp: Any, tokenizer: PreTrainedTokenizerBase) -> tuple[list[int], int]:
    task = getattr(exp, "task", None) if getattr(exp, "task_id", None) else None
    messages = getattr(exp, "messages", None) or (task.messages if task is not None else None)
    text = (task.prompt if task is not None and task.prompt else None) or exp.prompt_text
    prompt = prompt_ids(tokenizer, text=None if messages else text, messages=messages or None)
    completion = list(tokenizer(exp.response_text, add_special_tokens=False)["input_ids"])
    if tokenizer.eos_token_id is not None:
        completion.append(int(tokenizer.eos_token_id))
    return list(prompt) + completion, len(prompt)


@dataclass
class TrainBatch:
    """One optimizer step's data: the model's own rollouts (GRPO, DPO), expert ones (SFT,
    MIX), and explicit preferences (winner id, loser id) from pairwise feedback."""

    usual: list[Rollout] = field(default_factory=list)
    expert: list[Rollout] = field(default_factory=list)
    preferences: list[tuple[int, int]] = field(default_factory=list)

    @property
    def ids(self) -> list[int]:
        return [r.id for r in self.usual] + [r.id for r in self.expert]

    def __len__(self) -> int:
        return len(self.usual) + len(self.expert)


def trainable(rollouts: Iterable[Rollout]) -> list[Rollout]:
    """Rollouts with a token to learn from: an empty completion, or one whose action mask is
    all zeros (environment text only, a masked truncated response), has nothing to score."""
    return [r for r in rollouts if r.completion_ids and r.action_count > 0]


def scored(rollouts: Iterable[Rollout]) -> list[Rollout]:
    """Rollouts whose reward takes part in their group's statistics: every one with a
    response, masked or not (a masked truncated response still tells its group how well
    the prompt went; it just contributes no tokens to the loss)."""
    return [r for r in rollouts if r.completion_ids]


def group_advantages(rollouts: Sequence[Rollout], *, scale: str = "group") -> torch.Tensor:
    """Group-relative advantages, exactly as TRL's GRPOTrainer computes them from rewards:
    (r − mean of the group) / (std + 1e-4), std unbiased, per group ("group"), over the
    whole batch ("batch") or not at all ("none"). A missing reward gives advantage 0 and
    stays out of its group's statistics. Groups may differ in size (filtered members). A
    group whose rewards are equal (within TIE_TOLERANCE) gets advantages of exactly 0."""
    rewards = torch.tensor(
        [float("nan") if r.reward is None else float(r.reward) for r in rollouts], dtype=torch.float32
    )
    mean = torch.zeros_like(rewards)
    std = torch.zeros_like(rewards)
    index: dict[str, list[int]] = {}
    for i, r in enumerate(rollouts):
        index.setdefault(r.group_id, []).append(i)
    tied: list[torch.Tensor] = []
    for members in index.values():
        idx = torch.tensor(members)
        g = rewards[idx]
        mean[idx] = torch.nanmean(g)
        std[idx] = _nanstd(g)
        known = g[~torch.isnan(g)]
        if known.numel() and float(known.max() - known.min()) <= TIE_TOLERANCE:
            tied.append(idx)
    if scale == "batch":
        std = _nanstd(rewards).expand_as(rewards).clone()
    advantages = rewards - mean
    if scale != "none":
        advantages = advantages / (std + 1e-4)
    # A group whose members were rewarded alike teaches nothing: its advantages are 0 exactly.
    # float32's mean of equal rewards can be an ulp off them (0.2 x 8 / 8 is not 0.2), leaving
    # advantages of ~1e-8 where TRL's arithmetic would; Adam divides by the gradient's own
    # scale, so such dust moved the weights by a full learning-rate step in a direction set
    # by rounding (bench/steering's random10 arm: grad norms of 1e-8, and accuracy lost).
    for idx in tied:
        advantages[idx] = 0.0
    return torch.nan_to_num(advantages, nan=0.0)


# Rewards of one group that differ by at most this are equal (their spread is rounding).
TIE_TOLERANCE = 1e-6


def _nanstd(x: torch.Tensor) -> torch.Tensor:
    count = (~torch.isnan(x)).sum()
    if count < 2:
        return torch.zeros(())
    mean = torch.nanmean(x)
    variance = torch.nanmean((x - mean) ** 2) * (count / (count - 1))
    return torch.sqrt(variance)


def preference_pairs(
    rollouts: Sequence[Rollout], *, preferences: Sequence[tuple[int, int]] = ()
) -> list[tuple[Rollout, Rollout]]:
    """(chosen, rejected) pairs for DPO: every explicit preference whose two rollouts share
    a prompt, and for each group no preference covers, its best against its worst by reward
    (a ranked group's reward carries the ranking). Ties give no pair."""
    by_id = {r.id: r for r in rollouts}
    pairs: list[tuple[Rollout, Rollout]] = []
    covered: set[str] = set()
    for winner, loser in preferences:
        a, b = by_id.get(winner), by_id.get(loser)
        if a is None or b is None or a.prompt_ids != b.prompt_ids or not a.completion_ids or not b.completion_ids:
            continue
        pairs.append((a, b))
        covered.add(a.group_id)
    groups: dict[str, list[Rollout]] = {}
    for r in rollouts:
        if r.group_id not in covered and r.reward is not None and r.completion_ids:
            groups.setdefault(r.group_id, []).append(r)
    for members in groups.values():
        if len(members) < 2:
            continue
        ordered = sorted(members, key=lambda r: (-float(r.reward or 0.0), r.id))
        best, worst = ordered[0], ordered[-1]
        if best.reward is not None and worst.reward is not None and best.reward > worst.reward:
            pairs.append((best, worst))
    return pairs


T = TypeVar("T")


def deal(items: Sequence[T], world: int) -> list[list[T]]:
    """Deal `items` round-robin to `world` parts, in order (a learner gang's ranks)."""
    return [list(items[rank::world]) for rank in range(world)]
