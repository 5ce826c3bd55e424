"""`mlp`: an ensemble of small two-layer networks on the pooled hidden states of every layer
of the run's own model (its base, or the policy's checkpoint), the base frozen.

Features of one (prompt, completion), tokenised as `head` tokenises it, pooled over the
completion's tokens: each hidden layer's mean (the embeddings, every block's output, the
final state after the model's norm), the embeddings' maximum (which words it uses), the final
state at the last token, the log of the token count, and the base's log-likelihood statistics
of the completion (the `likelihood` kind's: sum, mean, least, and over the answer span,
`reward_model.answer_pattern`: what the base knows of a right answer); standardised on the
training completions. A network's score is v · z + w₂ · tanh(W₁ z + b₁): the linear part is `head`'s
(on more layers), the hidden units learn what no weighted sum of the features can, such as
a preference for one of two forms but not both, or a form only on a right answer. Each of
`ensemble` networks is fitted with the Bradley-Terry loss (each pair weighted by its margin
and trust, L2 `l2` on every weight, Adam, full batch) on its own bootstrap sample of the
pairs; the score is their mean, the spread their standard deviation. With
`crossval_folds`, each fold of prompts gets its own networks fitted without it, and the
held-out accuracy is out of fold, as `head`'s.

Why not the base fine-tuned with LoRA (TRL's RewardTrainer, the `classifier` kind on a
whole network): from the 100-200 pairs a run collects, a whole network overfits (bench/
steering's docstring: 0.60-0.67 against the head's 0.69-0.75 on the same 150 pairs), while
a few tens of thousands of weights on features the base already computes fit in a second
or two on a CPU.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from apps.rewards.ports import PreferencePair
from workers.reward_kinds import Fitted, KindScorer, RewardKindImpl, reward_kind_impl_register
from workers.reward_kinds.head import bootstrap_weights
from workers.reward_trainer import pairwise_accuracy, scorer_accuracy

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from apps.runs.ports import RewardModelConfig

MLP_FILE = "mlp_reward.json"
KIND = "mlp"
POOLING = "layer-means+embedding-max+last+log-length+likelihood"
# Hidden units per network, and the optimiser's full-batch steps.
HIDDEN = 32
STEPS = 300


def layer_features(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, prompts: Sequence[str],
                   completions: Sequence[str], *, max_length: int, answer_pattern: str | None = None,
                   batch_size: int = 32) -> list[list[float]]:
    """One pooled feature vector per (prompt, completion), over the completion's tokens: every
    hidden layer's mean, the embeddings' maximum, the final state at the last token, the log
    of the token count, and the base's log-likelihood statistics of the completion (the
    `likelihood` kind's: sum, mean, least, over the answer span; what the base knows of a
    right answer)."""
    import torch

    # Inside: these import torch and transformers (the kinds load them on first use only).
    from workers.likelihood_rm import rm_completion_ids, rm_prompt_ids
    from workers.likelihood_rm_hf import features_of, truncated

    pattern = re.compile(answer_pattern, re.DOTALL) if answer_pattern else None
    rows: list[tuple[list[int], int, tuple[int, int] | None]] = []
    for prompt, completion in zip(prompts, completions, strict=True):
        c, span = rm_completion_ids(tokenizer, completion, pattern)
        p, c, span = truncated(rm_prompt_ids(tokenizer, prompt), c, span, max_length)
        rows.append((p + c, len(p), span))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
    out: list[list[float]] = []
    for start in range(0, len(rows), batch_size):
        chunk = rows[start:start + batch_size]
        width = max(len(ids) for ids, _, _ in chunk)
        input_ids = torch.tensor([ids + [pad] * (width - len(ids)) for ids, _, _ in chunk], device=model.device)
        mask = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids, _, _ in chunk], device=model.device)
        with torch.inference_mode():
            result = model(input_ids=input_ids, attention_mask=mask, output_hidden_states=True)
            layers = [h.float() for h in result.hidden_states]  # the last one after the model's final norm
            token_lp = torch.log_softmax(result.logits.float()[:, :-1], -1).gather(2, input_ids[:, 1:, None])[..., 0]
            for row, (ids, cut, span) in enumerate(chunk):
                cut = min(cut, len(ids) - 1)
                where = slice(cut, len(ids))
                pooled = [h[row, where].mean(0) for h in layers]
                pooled += [layers[0][row, where].max(0).values, layers[-1][row, len(ids) - 1],
                           torch.tensor([math.log1p(len(ids) - cut)], device=layers[0].device)]
                # Position t of token_lp is the log-probability of token t + 1.
                lp = token_lp[row, max(cut, 1) - 1:len(ids) - 1].tolist()
                pooled.append(torch.tensor(features_of(lp, span), device=layers[0].device))
                out.append(torch.cat(pooled).cpu().tolist())
    return out


@dataclass
class Net:
    """One network's weights: score(z) = v · z + w2 · tanh(w1 z + b1)."""

    w1: list[list[float]]
    b1: list[float]
    w2: list[float]
    v: list[float]


def nets_scores(nets: Sequence[Net], z: torch.Tensor) -> torch.Tensor:
    """(items, nets): each network's score of each standardised feature row."""
    import torch

    cols = []
    for net in nets:
        w1, b1 = torch.tensor(net.w1, dtype=z.dtype), torch.tensor(net.b1, dtype=z.dtype)
        w2, v = torch.tensor(net.w2, dtype=z.dtype), torch.tensor(net.v, dtype=z.dtype)
        cols.append(z @ v + torch.tanh(z @ w1.T + b1) @ w2)
    return torch.stack(cols, 1)


def net_fit(chosen: list[list[float]], rejected: list[list[float]], weight: list[float], *, l2: float,
            seed: int, hidden: int = HIDDEN, steps: int = STEPS) -> Net:
    """One network maximising Σ weight · log σ(s(chosen) − s(rejected)) − l2 · |weights|²
    (the weights normalised to sum 1, as `head`'s Bradley-Terry fit)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    c, r = torch.tensor(chosen, dtype=torch.float32), torch.tensor(rejected, dtype=torch.float32)
    wt = torch.tensor(weight, dtype=torch.float32)
    wt = wt / wt.sum().clamp_min(1e-12)
    d = c.shape[1]
    w1 = (torch.randn(hidden, d, generator=g) / math.sqrt(d)).requires_grad_()
    b1 = torch.zeros(hidden, requires_grad=True)
    w2 = (torch.randn(hidden, generator=g) / math.sqrt(hidden)).requires_grad_()
    v = torch.zeros(d, requires_grad=True)
    params = [w1, b1, w2, v]
    optimizer = torch.optim.Adam(params, lr=1e-2)

    def score(x: torch.Tensor) -> torch.Tensor:
        return x @ v + torch.tanh(x @ w1.T + b1) @ w2

    for _ in range(steps):
        optimizer.zero_grad()
        loss = -(wt * torch.nn.functional.logsigmoid(score(c) - score(r))).sum()
        loss = loss + l2 * sum((p * p).sum() for p in (w1, w2, v))
        loss.backward()
        optimizer.step()
    return Net(w1=w1.detach().tolist(), b1=b1.detach().tolist(), w2=w2.detach().tolist(), v=v.detach().tolist())


def nets_fit(chosen: list[list[float]], rejected: list[list[float]], weight: list[float], *, nets: int, l2: float,
             seed: int) -> list[Net]:
    """`nets` networks, each on its bootstrap sample of the pairs given."""
    out = []
    for i, counts in enumerate(bootstrap_weights(len(chosen), heads=nets, seed=seed)):
        keep = [k for k, n in enumerate(counts) if n > 0]
        out.append(net_fit([chosen[k] for k in keep], [rejected[k] for k in keep],
                           [weight[k] * counts[k] for k in keep], l2=l2, seed=seed * 1000 + i))
    return out


@dataclass
class MlpEnsemble:
    base: str
    mean: list[float]
    std: list[float]
    nets: list[Net]
    max_length: int
    answer_pattern: str | None = None

    def standardise(self, features: Sequence[Sequence[float]]) -> torch.Tensor:
        import torch

        x = torch.tensor(features, dtype=torch.float32)
        return (x - torch.tensor(self.mean)) / torch.tensor(self.std)

    def score_spread(self, features: Sequence[Sequence[float]],
                     nets: Sequence[Net] | None = None) -> tuple[list[float], list[float]]:
        if not features:
            return [], []
        per_net = nets_scores(nets or self.nets, self.standardise(features)).double()
        spread = per_net.std(1, unbiased=False) if per_net.shape[1] > 1 else per_net[:, 0] * 0
        return per_net.mean(1).tolist(), spread.tolist()

    def save(self, out: Path) -> None:
        out.mkdir(parents=True, exist_ok=True)
        (out / MLP_FILE).write_text(json.dumps({
            "kind": KIND, "base": self.base, "pooling": POOLING, "mean": self.mean, "std": self.std,
            "nets": [asdict(n) for n in self.nets], "max_length": self.max_length,
            "answer_pattern": self.answer_pattern,
        }))

    @classmethod
    def load(cls, path: Path) -> MlpEnsemble:
        data = json.loads((path / MLP_FILE).read_text())
        if data.get("kind") != KIND or data.get("pooling") != POOLING:
            raise ValueError(f"{path}: not an mlp reward model of this version ({data.get('kind')!r})")
        return cls(base=data["base"], mean=data["mean"], std=data["std"], nets=[Net(**n) for n in data["nets"]],
                   max_length=int(data["max_length"]), answer_pattern=data.get("answer_pattern"))


class MlpScorer(KindScorer):
    def __init__(self, ensemble: MlpEnsemble, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, *,
                 batch_size: int = 32) -> None:
        self.ensemble, self.model, self.tokenizer, self.batch_size = ensemble, model, tokenizer, batch_size

    def features(self, prompts: Sequence[str], completions: Sequence[str]) -> list[list[float]]:
        return layer_features(self.model, self.tokenizer, prompts, completions, max_length=self.ensemble.max_length,
                              answer_pattern=self.ensemble.answer_pattern, batch_size=self.batch_size)

    def score_spread(self, prompts: Sequence[str],
                     completions: Sequence[str]) -> tuple[list[float], list[float] | None]:
        if not prompts:
            return [], []
        return self.ensemble.score_spread(self.features(prompts, completions))

    def score(self, prompts: Sequence[str], completions: Sequence[str]) -> list[float]:
        return self.score_spread(prompts, completions)[0]


class MlpFolds:
    """A cross-validated fit's folds (as `head`'s HeadFolds): each item ranked by the networks
    fitted without its prompt's fold; by the published ones where that fold has none."""

    def __init__(self, scorer: MlpScorer, *, folds: int, fold_nets: dict[int, list[Net]]) -> None:
        self.scorer, self.folds, self.fold_nets = scorer, folds, fold_nets

    def fold_fitted(self, prompt: str) -> bool:
        from workers.likelihood_rm import prompt_fold  # inside: torch at its import

        return prompt_fold(prompt, self.folds) in self.fold_nets

    def score_out_of_fold(self, prompts: Sequence[str], completions: Sequence[str], keys: Sequence[str]) -> list[float]:
        from workers.likelihood_rm import prompt_fold  # inside: torch at its import

        if not prompts:
            return []
        feats = self.scorer.features(prompts, completions)
        ensemble = self.scorer.ensemble
        return [ensemble.score_spread([f], self.fold_nets.get(prompt_fold(key, self.folds), ensemble.nets))[0][0]
                for f, key in zip(feats, keys, strict=True)]


def mlp_ensemble_fit(*, base: str, train: list[PreferencePair], max_length: int, nets: int, l2: float, seed: int,
                     model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, folds: int = 0,
                     answer_pattern: str | None = None) -> tuple[MlpEnsemble, dict[int, list[Net]], float | None]:
    """Fit the ensemble on `train` (features once, each network on its bootstrap sample); with
    `folds` >= 2 each fold's networks too, fitted without its prompts' pairs, and the
    out-of-fold pairwise accuracy: (ensemble, fold networks, accuracy); ({}, None) without."""
    import torch

    from workers.likelihood_rm import prompt_fold  # inside: torch at its import

    texts: dict[tuple[str, str], int] = {}
    for p in train:
        texts.setdefault((p.prompt, p.chosen), len(texts))
        texts.setdefault((p.prompt, p.rejected), len(texts))
    keys = list(texts)
    feats = layer_features(model, tokenizer, [k[0] for k in keys], [k[1] for k in keys], max_length=max_length,
                           answer_pattern=answer_pattern)
    n = len(feats[0])
    mean = [sum(f[i] for f in feats) / len(feats) for i in range(n)]
    std = [math.sqrt(sum((f[i] - mean[i]) ** 2 for f in feats) / len(feats)) or 1.0 for i in range(n)]
    ensemble = MlpEnsemble(base=base, mean=mean, std=std, nets=[], max_length=max_length, answer_pattern=answer_pattern)
    z = ensemble.standardise(feats).tolist()
    chosen = [z[texts[(p.prompt, p.chosen)]] for p in train]
    rejected = [z[texts[(p.prompt, p.rejected)]] for p in train]
    weight = [max(p.margin, 1e-3) * p.trust for p in train]
    ensemble.nets = nets_fit(chosen, rejected, weight, nets=nets, l2=l2, seed=seed)
    if folds < 2:
        return ensemble, {}, None
    fold_of = [prompt_fold(p.prompt, folds) for p in train]
    fold_nets: dict[int, list[Net]] = {}
    for k in sorted(set(fold_of)):
        rest = [i for i, f in enumerate(fold_of) if f != k]
        if rest:
            fold_nets[k] = nets_fit([chosen[i] for i in rest], [rejected[i] for i in rest], [weight[i] for i in rest],
                                    nets=nets, l2=l2, seed=seed + 1 + k)
    ranked = [i for i, k in enumerate(fold_of) if k in fold_nets]

    def oof(rows: list[list[float]]) -> list[float]:
        return [float(nets_scores(fold_nets[fold_of[i]], torch.tensor([rows[i]])).mean()) for i in ranked]

    accuracy = pairwise_accuracy(oof(chosen), oof(rejected), [train[i].trust for i in ranked])
    return ensemble, fold_nets, accuracy


@reward_kind_impl_register
class Mlp(RewardKindImpl):
    name = "mlp"

    def fit(self, *, cfg: RewardModelConfig, base: str, train: list[PreferencePair], heldout: list[PreferencePair],
            out: Path, seed: int) -> Fitted:
        from workers.likelihood_rm import causal_lm_load  # inside: torch at its import

        model, tokenizer = causal_lm_load(base)
        folds = cfg.crossval_folds
        if folds >= 2:
            train = train + heldout  # every pair trains the version and is held out once in the folds
        ensemble, fold_nets, accuracy = mlp_ensemble_fit(
            base=base, train=train, max_length=cfg.max_length, nets=cfg.ensemble, l2=cfg.l2, seed=seed, model=model,
            tokenizer=tokenizer, folds=folds, answer_pattern=cfg.answer_pattern or None)
        ensemble.save(out)
        tokenizer.save_pretrained(out)
        scorer = MlpScorer(ensemble, model, tokenizer)
        if folds >= 2:
            oof = MlpFolds(scorer, folds=folds, fold_nets=fold_nets)
            return Fitted(scorer, accuracy, train, train, calibration_score=oof.score_out_of_fold, out_of_fold=oof)
        if heldout:
            accuracy = scorer_accuracy(scorer.score, heldout)
        return Fitted(scorer, accuracy, train, heldout)

    def owns(self, path: Path) -> bool:
        return (path / MLP_FILE).is_file()

    def load(self, path: str, *, max_length: int, batch_size: int) -> KindScorer:
        from workers.likelihood_rm import causal_lm_load  # inside: torch at its import

        ensemble = MlpEnsemble.load(Path(path))
        model, tokenizer = causal_lm_load(ensemble.base)
        return MlpScorer(ensemble, model, tokenizer, batch_size=batch_size)
