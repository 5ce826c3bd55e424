"""`head`, the default kind: an ensemble of linear scalar heads on the pooled hidden states
of the run's own model (its base, or the policy's checkpoint), the base frozen.

Features of one (prompt, completion), tokenised as the trainer tokenises it (the prompt
through the chat template, the completion's tokens, then eos), pooled over the completion's
tokens: the token embeddings' mean and maximum (which words it uses: a house word, a format's
markers), the last hidden layer's mean and its state at the last token (what the model makes of
the answer in context), and the log of the token count (its length). They are standardised on
the training completions. (On a crafted preference for completions containing one word, 45
pairs over the demo model: 0.82-0.84 held-out pairwise accuracy with the last layer alone,
1.00 with the embeddings' pools beside it.) Each of `ensemble` heads is fitted with the Bradley-Terry loss
(P(chosen ≻ rejected) = σ(w · (z_chosen − z_rejected)), L2 `l2`, L-BFGS, each pair weighted by
its margin and trust) on its own bootstrap sample of the pairs. A completion's raw score is the
heads' mean, its spread their standard deviation: where the heads disagree, a label teaches
the most (the selection rule's uncertainty).

Why this and not TRL's RewardTrainer from the start: with tens of labels a whole network
(the `classifier` kind) overfits or learns nothing, while a few thousand head weights on
features the model already has learn a style (a word, a format, a length) from that many
pairs, in seconds on a CPU. The base is pinned in the version's `head_reward.json`, so a
later policy checkpoint does not change what a version means.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from apps.rewards.ports import PreferencePair
from workers.reward_kinds import Fitted, KindScorer, RewardKindImpl, reward_kind_impl_register
from workers.reward_trainer import pairwise_accuracy, scorer_accuracy

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from apps.runs.ports import RewardModelConfig

HEAD_FILE = "head_reward.json"
KIND = "head"
POOLING = "embedding-mean+embedding-max+mean+last+log-length"


def hidden_features(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, prompts: Sequence[str],
                    completions: Sequence[str], *, max_length: int, batch_size: int = 32) -> list[list[float]]:
    """One pooled feature vector per (prompt, completion), over the completion's tokens: the
    token embeddings' mean and maximum (which words it uses), the last hidden layer's mean
    and its state at the last token (what the model makes of it in context), and the log of
    its token count (its length)."""
    import torch

    from workers.likelihood_rm import rm_completion_ids, rm_prompt_ids
    from workers.likelihood_rm_hf import truncated

    rows: list[tuple[list[int], int]] = []
    for prompt, completion in zip(prompts, completions, strict=True):
        c, _ = rm_completion_ids(tokenizer, completion, None)
        p, c, _ = truncated(rm_prompt_ids(tokenizer, prompt), c, None, max_length)
        rows.append((p + c, len(p)))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
    backbone = getattr(model, "base_model", model)
    out: list[list[float]] = []
    for start in range(0, len(rows), batch_size):
        chunk = rows[start:start + batch_size]
        width = max(len(ids) for ids, _ in chunk)
        input_ids = torch.tensor([ids + [pad] * (width - len(ids)) for ids, _ in chunk], device=model.device)
        mask = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids, _ in chunk], device=model.device)
        with torch.inference_mode():
            result = backbone(input_ids=input_ids, attention_mask=mask, output_hidden_states=True)
            embedded = result.hidden_states[0].float()
            # The backbone's output is after its final norm; a model without one gives its last layer.
            last = getattr(result, "last_hidden_state", None)
            hidden = (last if last is not None else result.hidden_states[-1]).float()
            for row, (ids, cut) in enumerate(chunk):
                cut = min(cut, len(ids) - 1)
                words = embedded[row, cut:len(ids)]
                pooled = torch.cat([words.mean(0), words.max(0).values, hidden[row, cut:len(ids)].mean(0),
                                    hidden[row, len(ids) - 1],
                                    torch.tensor([math.log1p(len(ids) - cut)], device=hidden.device)])
                out.append(pooled.cpu().tolist())
    return out


def bootstrap_weights(pairs: int, *, heads: int, seed: int) -> list[list[float]]:
    """Each head's multiplicity of each pair: a bootstrap sample (drawn with replacement);
    one head alone trains on every pair once."""
    if heads == 1:
        return [[1.0] * pairs]
    rng = random.Random(seed)
    out = []
    for _ in range(heads):
        counts = [0.0] * pairs
        for _ in range(pairs):
            counts[rng.randrange(pairs)] += 1.0
        out.append(counts)
    return out


@dataclass
class HeadEnsemble:
    base: str
    mean: list[float]
    std: list[float]
    heads: list[list[float]]
    max_length: int

    def standardise(self, features: Sequence[Sequence[float]]) -> list[list[float]]:
        return [[(x - m) / s for x, m, s in zip(f, self.mean, self.std, strict=True)] for f in features]

    def score_spread(self, features: Sequence[Sequence[float]]) -> tuple[list[float], list[float]]:
        import torch

        if not features:
            return [], []
        z = torch.tensor(self.standardise(features), dtype=torch.float64)
        per_head = z @ torch.tensor(self.heads, dtype=torch.float64).T  # (items, heads)
        spread = per_head.std(1, unbiased=False) if per_head.shape[1] > 1 else torch.zeros(per_head.shape[0])
        return per_head.mean(1).tolist(), spread.tolist()

    def save(self, out: Path) -> None:
        out.mkdir(parents=True, exist_ok=True)
        (out / HEAD_FILE).write_text(json.dumps({
            "kind": KIND, "base": self.base, "pooling": POOLING, "mean": self.mean, "std": self.std,
            "heads": self.heads, "max_length": self.max_length,
        }))

    @classmethod
    def load(cls, path: Path) -> HeadEnsemble:
        data = json.loads((path / HEAD_FILE).read_text())
        if data.get("kind") != KIND or data.get("pooling") != POOLING:
            raise ValueError(f"{path}: not a head reward model of this version ({data.get('kind')!r})")
        return cls(base=data["base"], mean=data["mean"], std=data["std"], heads=data["heads"],
                   max_length=int(data["max_length"]))


class HeadScorer(KindScorer):
    def __init__(self, ensemble: HeadEnsemble, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, *,
                 batch_size: int = 32) -> None:
        self.ensemble, self.model, self.tokenizer, self.batch_size = ensemble, model, tokenizer, batch_size

    def features(self, prompts: Sequence[str], completions: Sequence[str]) -> list[list[float]]:
        return hidden_features(self.model, self.tokenizer, prompts, completions, max_length=self.ensemble.max_length,
                               batch_size=self.batch_size)

    def score_spread(self, prompts: Sequence[str],
                     completions: Sequence[str]) -> tuple[list[float], list[float] | None]:
        if not prompts:
            return [], []
        return self.ensemble.score_spread(self.features(prompts, completions))

    def score(self, prompts: Sequence[str], completions: Sequence[str]) -> list[float]:
        return self.score_spread(prompts, completions)[0]


def _heads_fit(chosen: list[list[float]], rejected: list[list[float]], weight: list[float], *, heads: int, l2: float,
               seed: int) -> list[list[float]]:
    """`heads` Bradley-Terry heads, each on its bootstrap sample of the pairs given."""
    from workers.likelihood_rm import bradley_terry_fit

    out = []
    for counts in bootstrap_weights(len(chosen), heads=heads, seed=seed):
        keep = [i for i, c in enumerate(counts) if c > 0]
        out.append(bradley_terry_fit([chosen[i] for i in keep], [rejected[i] for i in keep],
                                     [weight[i] * counts[i] for i in keep], l2=l2))
    return out


class HeadFolds:
    """A cross-validated fit's folds: for each fold of prompts (workers.likelihood_rm.prompt_fold),
    the heads fitted on the other folds' pairs. Ranks an item as a version that never saw its
    prompt would (what reward_trainer's calibration and random-share accuracy read)."""

    def __init__(self, scorer: HeadScorer, *, folds: int, fold_heads: dict[int, list[list[float]]]) -> None:
        self.scorer, self.folds, self.fold_heads = scorer, folds, fold_heads

    def fold_fitted(self, prompt: str) -> bool:
        from workers.likelihood_rm import prompt_fold

        return prompt_fold(prompt, self.folds) in self.fold_heads

    def score_out_of_fold(self, prompts: Sequence[str], completions: Sequence[str], keys: Sequence[str]) -> list[float]:
        """Each item scored by the heads of its prompt's fold (`keys`: the items' prompts); by
        the published heads where that fold has none (its prompts were in no pair)."""
        from workers.likelihood_rm import prompt_fold

        if not prompts:
            return []
        ensemble = self.scorer.ensemble
        z = ensemble.standardise(self.scorer.features(prompts, completions))
        out = []
        for row, key in zip(z, keys, strict=True):
            heads = self.fold_heads.get(prompt_fold(key, self.folds), ensemble.heads)
            out.append(sum(sum(w * x for w, x in zip(h, row, strict=True)) for h in heads) / len(heads))
        return out


def head_ensemble_fit(*, base: str, train: list[PreferencePair], max_length: int, heads: int, l2: float, seed: int,
                      model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase,
                      folds: int = 0) -> tuple[HeadEnsemble, dict[int, list[list[float]]], float | None]:
    """Fit the ensemble on `train` (features computed once, each head on its bootstrap sample).
    With `folds` >= 2 also each fold's heads, fitted without its prompts' pairs, and the
    out-of-fold pairwise accuracy: (ensemble, fold heads, accuracy); ({}, None) without."""
    from workers.likelihood_rm import prompt_fold

    texts: dict[tuple[str, str], int] = {}
    for p in train:
        texts.setdefault((p.prompt, p.chosen), len(texts))
        texts.setdefault((p.prompt, p.rejected), len(texts))
    keys = list(texts)
    feats = hidden_features(model, tokenizer, [k[0] for k in keys], [k[1] for k in keys], max_length=max_length)
    n = len(feats[0])
    mean = [sum(f[i] for f in feats) / len(feats) for i in range(n)]
    std = [math.sqrt(sum((f[i] - mean[i]) ** 2 for f in feats) / len(feats)) or 1.0 for i in range(n)]
    ensemble = HeadEnsemble(base=base, mean=mean, std=std, heads=[], max_length=max_length)
    z = ensemble.standardise(feats)
    chosen = [z[texts[(p.prompt, p.chosen)]] for p in train]
    rejected = [z[texts[(p.prompt, p.rejected)]] for p in train]
    # A pair counts by how much more the chosen was preferred and how far its raters are
    # trusted (apps.feedback.preferences), times its multiplicity in the head's sample.
    weight = [max(p.margin, 1e-3) * p.trust for p in train]
    ensemble.heads = _heads_fit(chosen, rejected, weight, heads=heads, l2=l2, seed=seed)
    if folds < 2:
        return ensemble, {}, None
    fold_of = [prompt_fold(p.prompt, folds) for p in train]
    fold_heads: dict[int, list[list[float]]] = {}
    for k in sorted(set(fold_of)):
        rest = [i for i, f in enumerate(fold_of) if f != k]
        if rest:
            fold_heads[k] = _heads_fit([chosen[i] for i in rest], [rejected[i] for i in rest],
                                       [weight[i] for i in rest], heads=heads, l2=l2, seed=seed + 1 + k)

    def oof(x: list[float], k: int) -> float:
        return sum(sum(w * v for w, v in zip(h, x, strict=True)) for h in fold_heads[k]) / len(fold_heads[k])

    ranked = [i for i, k in enumerate(fold_of) if k in fold_heads]  # one fold holding every prompt: none
    accuracy = pairwise_accuracy([oof(chosen[i], fold_of[i]) for i in ranked],
                                 [oof(rejected[i], fold_of[i]) for i in ranked], [train[i].trust for i in ranked])
    return ensemble, fold_heads, accuracy


def _base_model(base: str) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The frozen base, resident for the worker's life (shared with the likelihood kind)."""
    from workers.likelihood_rm import causal_lm_load

    return causal_lm_load(base)


@reward_kind_impl_register
class Head(RewardKindImpl):
    name = "head"

    def fit(self, *, cfg: RewardModelConfig, base: str, train: list[PreferencePair], heldout: list[PreferencePair],
            out: Path, seed: int) -> Fitted:
        model, tokenizer = _base_model(base)
        folds = cfg.crossval_folds
        if folds >= 2:
            train = train + heldout  # every pair trains the version and is held out once in the folds
        ensemble, fold_heads, accuracy = head_ensemble_fit(
            base=base, train=train, max_length=cfg.max_length, heads=cfg.ensemble, l2=cfg.l2, seed=seed, model=model,
            tokenizer=tokenizer, folds=folds)
        ensemble.save(out)
        tokenizer.save_pretrained(out)
        scorer = HeadScorer(ensemble, model, tokenizer)
        if folds >= 2:
            oof = HeadFolds(scorer, folds=folds, fold_heads=fold_heads)
            return Fitted(scorer, accuracy, train, train, calibration_score=oof.score_out_of_fold, out_of_fold=oof)
        if heldout:
            accuracy = scorer_accuracy(scorer.score, heldout)
        return Fitted(scorer, accuracy, train, heldout)

    def owns(self, path: Path) -> bool:
        return (path / HEAD_FILE).is_file()

    def load(self, path: str, *, max_length: int, batch_size: int) -> KindScorer:
        ensemble = HeadEnsemble.load(Path(path))
        model, tokenizer = _base_model(ensemble.base)
        return HeadScorer(ensemble, model, tokenizer, batch_size=batch_size)
