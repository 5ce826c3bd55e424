"""`lora`: the run's own base fine-tuned with a LoRA adapter (peft) under a scalar score, on
people's pairs with the Bradley-Terry loss TRL's RewardTrainer minimises (−log σ(r_chosen −
r_rejected)), each pair weighted by its margin and trust.

The score of one (prompt, completion), tokenised as `head` tokenises it, is w · z: z is `head`'s
pooled features (the embeddings' mean and maximum over the completion, the last layer's mean and
its last token's state, the log length) and the base's log-likelihood of the completion (its mean
per token) and of the answer span (`reward_model.answer_pattern`: sum, mean, present),
standardised on the training completions as the frozen base computes them. The fit starts as
`head` does (one Bradley-Terry head on the frozen features, L-BFGS, L2 `l2`), then trains that
head and a LoRA adapter on every linear layer of the base (rank 8, alpha 16: the trainer's
`trainer.lora` defaults) together, Adam, `epochs` passes over the pairs in batches of
`batch_size` pairs, the adapter at ADAPTER_LR. Where `head` can only weigh what the frozen
base already computes, the adapter changes what the base computes: the hidden states the head
reads, and the likelihood of the answer it is shown (what the base knows of a right answer,
which the `likelihood` and `mlp` kinds can only read as it is).

Why this and not TRL's RewardTrainer itself (the `classifier` kind with a peft config): its
score is a fresh linear layer on the last token's state, which from a run's 100-200 pairs learns
less than `head` (bench/reward_model's docstring); starting from `head`'s fit on the features
`head` reads keeps what a linear head gets and lets the adapter add to it, and a loop of our own
weighs each pair by its margin and trust as every other kind does. A version is the adapter
(`adapter/`, megabytes) and `lora_reward.json` (the base, pinned; the head; the standardisation);
loading merges the adapter into a copy of the base. One fit, no ensemble (no spread) and no
folds: each would be another fine-tuning.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from apps.rewards.ports import PreferencePair
from kernel.config import AdapterConfig
from workers.weights.adapters import adapter_load, adapter_wrap
from workers.reward.kinds import Fitted, KindScorer, RewardKindImpl, reward_kind_impl_register
from workers.reward.kinds.base_model import Row, causal_lm_load, pad_of, rm_batch, rm_rows
from workers.reward.kinds.pair_fit import bradley_terry_fit, pair_texts, pair_weights
from workers.reward.trainer import scorer_accuracy

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from apps.runs.ports import RewardModelConfig

LORA_FILE = "lora_reward.json"
ADAPTER_DIR = "adapter"
KIND = "lora"
POOLING = "embedding-mean+embedding-max+mean+last+log-length+completion-mean-lp+answer-lp"
# The adapter's learning rate. Not `reward_model.learning_rate`: that is the `classifier`'s rate
# for a whole network (2e-4), at which a rank-8 adapter barely moves in a few hundred steps
# (bench/reward_model, generated:1 seed 0: 0.733 at 3e-4, 0.784 at 2e-3, `head` 0.715).
ADAPTER_LR = 2e-3
# The head learns at this rate beside the adapter (it starts fitted: small steps).
HEAD_LR = 1e-2
# At most this many optimiser steps per fit, whatever `epochs` and the pair count: a fit's time
# stays bounded on a CPU (about a forward and backward pass of 2 × batch_size texts each).
MAX_STEPS = 400


def lora_features(model: PreTrainedModel, rows: Sequence[Row], *, pad: int) -> torch.Tensor:
    """(items, features): the pooled features of each row under `model` (with an adapter or
    not), differentiable (the caller picks inference or training mode)."""
    import torch

    backbone = model.base_model  # the decoder without its output head: its last state is after the final norm
    input_ids, mask = rm_batch(rows, pad=pad, device=model.device)
    result = backbone(input_ids=input_ids, attention_mask=mask, output_hidden_states=True)
    embedded = result.hidden_states[0].float()
    hidden = result.last_hidden_state.float()
    logits = model.get_output_embeddings()(result.last_hidden_state).float()
    # Position t of token_lp is the log-probability of token t + 1.
    token_lp = torch.log_softmax(logits[:, :-1], -1).gather(2, input_ids[:, 1:, None])[..., 0]
    out = []
    for row, (ids, cut, span) in enumerate(rows):
        cut = min(cut, len(ids) - 1)
        words = embedded[row, cut:len(ids)]
        lp = token_lp[row, max(cut, 1) - 1:len(ids) - 1]
        answer = lp[span[0]:min(span[1], lp.shape[0])] if span else lp[:0]
        has = answer.shape[0] > 0
        zero = lp.new_zeros(())
        out.append(torch.cat([
            words.mean(0), words.max(0).values, hidden[row, cut:len(ids)].mean(0), hidden[row, len(ids) - 1],
            torch.stack([lp.new_tensor(math.log1p(len(ids) - cut)), lp.mean(),
                         answer.sum() if has else zero, answer.mean() if has else zero,
                         lp.new_tensor(1.0 if has else 0.0)]),
        ]))
    return torch.stack(out)


def features_batched(model: PreTrainedModel, rows: Sequence[Row], *, pad: int, batch_size: int = 32) -> torch.Tensor:
    """lora_features over `rows` in batches, without gradients."""
    import torch

    with torch.inference_mode():
        return torch.cat([lora_features(model, rows[i:i + batch_size], pad=pad)
                          for i in range(0, len(rows), batch_size)]).cpu()


@dataclass
class LoraHead:
    """What `lora_reward.json` holds beside the adapter: score = w · (features − mean) / std."""

    base: str
    mean: list[float]
    std: list[float]
    w: list[float]
    max_length: int
    answer_pattern: str | None

    def save(self, out: Path) -> None:
        out.mkdir(parents=True, exist_ok=True)
        (out / LORA_FILE).write_text(json.dumps({"kind": KIND, "pooling": POOLING, **asdict(self)}))

    @classmethod
    def load(cls, path: Path) -> LoraHead:
        data = json.loads((path / LORA_FILE).read_text())
        if data.pop("kind", None) != KIND or data.pop("pooling", None) != POOLING:
            raise ValueError(f"{path}: not a lora reward model of this version")
        return cls(**data)


class LoraScorer(KindScorer):
    """A fitted version: the base with its adapter merged in, and the head."""

    def __init__(self, head: LoraHead, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, *,
                 batch_size: int = 32) -> None:
        self.head, self.model, self.tokenizer, self.batch_size = head, model, tokenizer, batch_size

    def score(self, prompts: Sequence[str], completions: Sequence[str]) -> list[float]:
        import torch

        if not prompts:
            return []
        rows = rm_rows(self.tokenizer, prompts, completions, max_length=self.head.max_length,
                       answer_pattern=self.head.answer_pattern)
        feats = features_batched(self.model, rows, pad=pad_of(self.tokenizer), batch_size=self.batch_size).double()
        z = (feats - torch.tensor(self.head.mean, dtype=torch.float64)) / torch.tensor(self.head.std,
                                                                                      dtype=torch.float64)
        return [float(x) for x in z @ torch.tensor(self.head.w, dtype=torch.float64)]


def lora_reward_fit(*, base: str, train: list[PreferencePair], max_length: int, answer_pattern: str | None, l2: float,
                    epochs: int, batch_size: int, seed: int, out: Path,
                    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> tuple[LoraHead, PreTrainedModel]:
    """Fit the head on the frozen base, then the head and an adapter together; save the adapter
    and the head to `out`. Returns (head, the base with the adapter merged in, in eval mode)."""
    import torch

    torch.manual_seed(seed)
    texts = pair_texts(train)
    rows = rm_rows(tokenizer, [k[0] for k in texts], [k[1] for k in texts], max_length=max_length,
                   answer_pattern=answer_pattern)
    pad = pad_of(tokenizer)
    frozen = features_batched(model, rows, pad=pad).double()
    mean, std = frozen.mean(0), frozen.std(0, unbiased=False)
    std = torch.where(std > 0, std, torch.ones_like(std))
    z = ((frozen - mean) / std).tolist()
    ci = [texts[(p.prompt, p.chosen)] for p in train]
    ri = [texts[(p.prompt, p.rejected)] for p in train]
    weight = pair_weights(train)
    w0 = bradley_terry_fit([z[i] for i in ci], [z[i] for i in ri], weight, l2=l2)

    # Fresh adapter: B = 0, so the first step scores exactly as the head on the frozen base.
    net = adapter_wrap(model=model, lora=AdapterConfig())
    net.train()
    inner: PreTrainedModel = net.get_base_model()
    device = inner.device
    w = torch.tensor(w0, dtype=torch.float32, device=device, requires_grad=True)
    mean_t, std_t = mean.float().to(device), std.float().to(device)
    adapter = [p for p in net.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam([{"params": adapter, "lr": ADAPTER_LR}, {"params": [w], "lr": HEAD_LR}])
    rng = random.Random(seed)
    order = list(range(len(train)))
    steps = min(MAX_STEPS, epochs * math.ceil(len(train) / batch_size))
    step = 0
    while step < steps:
        rng.shuffle(order)
        for start in range(0, len(order), batch_size):
            if step >= steps:
                break
            batch = order[start:start + batch_size]
            used = sorted({ci[k] for k in batch} | {ri[k] for k in batch})
            where = {t: i for i, t in enumerate(used)}
            s = ((lora_features(inner, [rows[t] for t in used], pad=pad) - mean_t) / std_t) @ w
            c = s[torch.tensor([where[ci[k]] for k in batch], device=device)]
            r = s[torch.tensor([where[ri[k]] for k in batch], device=device)]
            wt = torch.tensor([weight[k] for k in batch], device=device)
            loss = -(wt * torch.nn.functional.logsigmoid(c - r)).sum() / wt.sum().clamp_min(1e-12) + l2 * (w * w).sum()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
    net.eval()
    net.save_pretrained(str(out / ADAPTER_DIR))
    merged: PreTrainedModel = net.merge_and_unload()
    merged.eval()
    head = LoraHead(base=base, mean=mean.tolist(), std=std.tolist(), w=w.detach().cpu().double().tolist(),
                    max_length=max_length, answer_pattern=answer_pattern)
    head.save(out)
    return head, merged


def base_copy(base: str) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A copy of the resident base (workers.reward.kinds.base_model.causal_lm_load, shared with
    the other kinds) of this version's own: peft writes the adapter's layers into the model it
    wraps, and merging writes into its weights."""
    import copy

    model, tokenizer = causal_lm_load(base)
    return copy.deepcopy(model), tokenizer


@reward_kind_impl_register
class Lora(RewardKindImpl):
    name = "lora"

    def fit(self, *, cfg: RewardModelConfig, base: str, train: list[PreferencePair], heldout: list[PreferencePair],
            out: Path, seed: int) -> Fitted:
        model, tokenizer = base_copy(base)
        head, merged = lora_reward_fit(
            base=base, train=train, max_length=cfg.max_length, answer_pattern=cfg.answer_pattern or None, l2=cfg.l2,
            epochs=cfg.epochs, batch_size=cfg.batch_size, seed=seed, out=out,
            model=model, tokenizer=tokenizer)
        tokenizer.save_pretrained(out)
        scorer = LoraScorer(head, merged, tokenizer)
        accuracy = scorer_accuracy(scorer.score, heldout) if heldout else None
        return Fitted(scorer, accuracy, train, heldout)

    def owns(self, path: Path) -> bool:
        return (path / LORA_FILE).is_file()

    def load(self, path: str, *, max_length: int, batch_size: int) -> KindScorer:
        head = LoraHead.load(Path(path))
        model, tokenizer = base_copy(head.base)
        merged: PreTrainedModel = adapter_load(base_model=model, path=Path(path) / ADAPTER_DIR,
                                               trainable=False).merge_and_unload()
        merged.eval()
        return LoraScorer(head, merged, tokenizer, batch_size=batch_size)
