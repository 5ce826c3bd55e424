"""Cross-validated held-out accuracy of the likelihood reward model (crafted features, no
model): every pair is ranked by a fit that never saw its prompt, so a feature that decides
people's preference scores 1.0 on all pairs, and a preference unrelated to the features
scores about chance; what the gate then counts is every pair, not a held-out share."""

from __future__ import annotations

import random

import pytest

from apps.feedback.preferences import PreferencePair
from workers.likelihood_rm import crossval_accuracy


def _pairs(n_prompts: int, *, informative: bool, seed: int = 0) -> tuple[list[list[float]], dict[tuple[str, str], int],
                                                                          list[PreferencePair]]:
    rng = random.Random(seed)
    z: list[list[float]] = []
    texts: dict[tuple[str, str], int] = {}
    pairs = []
    for g in range(n_prompts):
        prompt = f"p{g}"
        good = [rng.gauss(1.0, 0.3), rng.gauss(0, 1)]
        bad = [rng.gauss(-1.0, 0.3), rng.gauss(0, 1)]
        for name, f in (("good", good), ("bad", bad)):
            texts[(prompt, name)] = len(z)
            z.append(f)
        chosen, rejected = ("good", "bad") if informative or rng.random() < 0.5 else ("bad", "good")
        pairs.append(PreferencePair(prompt=prompt, chosen=chosen, rejected=rejected, chosen_id=2 * g,
                                    rejected_id=2 * g + 1, group_id=f"g{g}", kind="rating", margin=1.0))
    return z, texts, pairs


def test_a_deciding_feature_ranks_every_pair_right_out_of_fold() -> None:
    z, texts, pairs = _pairs(24, informative=True)
    assert crossval_accuracy(z, texts, pairs, folds=4, l2=1e-2) == 1.0


def test_a_preference_the_features_do_not_explain_scores_about_chance() -> None:
    z, texts, pairs = _pairs(200, informative=False, seed=1)
    assert crossval_accuracy(z, texts, pairs, folds=4, l2=1e-2) == pytest.approx(0.5, abs=0.1)
