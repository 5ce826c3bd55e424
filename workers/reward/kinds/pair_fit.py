"""What the reward-model kinds fit with on the run's preference pairs: each text of the pairs
once (`pair_texts`), its features and their columns' mean and spread (`pair_features`), each
pair's weight (`pair_weights`), Bradley-Terry weights (`bradley_terry_fit`), a prompt's
cross-validation fold (`prompt_fold`) and an ensemble member's bootstrap sample
(`bootstrap_weights`). No torch at import (the fit imports it when called)."""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from apps.rewards.ports import PreferencePair

# A (prompt, completion) the pairs hold.
Text = tuple[str, str]
# The features of some (prompt, completion)s: (prompts, completions) -> one row each.
Features = Callable[[list[str], list[str]], list[list[float]]]


def pair_texts(pairs: Sequence[PreferencePair]) -> dict[Text, int]:
    """Every (prompt, completion) the pairs hold, once, numbered in the order first met."""
    texts: dict[Text, int] = {}
    for p in pairs:
        texts.setdefault((p.prompt, p.chosen), len(texts))
        texts.setdefault((p.prompt, p.rejected), len(texts))
    return texts


@dataclass(frozen=True)
class PairFeatures:
    """The pairs' texts (each numbered once), their feature rows in that order, and each
    column's mean and standard deviation over them (1 where a column does not vary)."""

    texts: dict[Text, int]
    rows: list[list[float]]
    mean: list[float]
    std: list[float]

    def sides(self, z: Sequence[Sequence[float]],
              pairs: Sequence[PreferencePair]) -> tuple[list[Sequence[float]], list[Sequence[float]]]:
        """The rows of `z` (one per text, as `rows`) of each pair's chosen and rejected text."""
        return ([z[self.texts[(p.prompt, p.chosen)]] for p in pairs],
                [z[self.texts[(p.prompt, p.rejected)]] for p in pairs])


def pair_features(pairs: Sequence[PreferencePair], features: Features) -> PairFeatures:
    """The pairs' texts' features, each text's computed once, and the columns' mean and std."""
    texts = pair_texts(pairs)
    keys = list(texts)
    rows = features([k[0] for k in keys], [k[1] for k in keys])
    n = len(rows[0])
    mean = [sum(f[i] for f in rows) / len(rows) for i in range(n)]
    std = [math.sqrt(sum((f[i] - mean[i]) ** 2 for f in rows) / len(rows)) or 1.0 for i in range(n)]
    return PairFeatures(texts=texts, rows=rows, mean=mean, std=std)


def pair_weights(pairs: Sequence[PreferencePair]) -> list[float]:
    """Each pair's weight in a fit: how much more the chosen was preferred and how far its
    raters are trusted (apps.feedback.reward_model.preferences)."""
    return [max(p.margin, 1e-3) * p.trust for p in pairs]


def bradley_terry_fit(chosen: Sequence[Sequence[float]], rejected: Sequence[Sequence[float]],
                      weights: Sequence[float], *, l2: float = 1e-2) -> list[float]:
    """Weights w maximising Σ weight · log σ(w · (chosen − rejected)) − l2 · |w|² (no bias:
    the model of a preference is antisymmetric)."""
    import torch

    diff = torch.tensor(chosen, dtype=torch.float64) - torch.tensor(rejected, dtype=torch.float64)
    weight = torch.tensor(weights, dtype=torch.float64)
    weight = weight / weight.sum().clamp_min(1e-12)
    w = torch.zeros(diff.shape[1], dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.LBFGS([w], lr=1.0, max_iter=200, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = -(weight * torch.nn.functional.logsigmoid(diff @ w)).sum() + l2 * (w * w).sum()
        loss.backward()
        return loss

    optimizer.step(closure)
    return [float(x) for x in w.detach()]


def prompt_fold(prompt: str, folds: int) -> int:
    """A prompt's fold: all its pairs (every group of it) share one."""
    digest = hashlib.sha256(f"fold:{prompt}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % folds


def bootstrap_weights(pairs: int, *, heads: int, seed: int) -> list[list[float]]:
    """Each ensemble member's multiplicity of each pair: a bootstrap sample (drawn with
    replacement); one member alone trains on every pair once."""
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
