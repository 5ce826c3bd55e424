"""Cross-validated held-out accuracy of the likelihood reward model (crafted features, no
model): every pair is ranked by a fit that never saw its prompt, so a feature that decides
people's preference scores 1.0 on all pairs, and a preference unrelated to the features
scores about chance; what the gate then counts is every pair, not a held-out share."""

from __future__ import annotations

import random
import statistics

import pytest

from apps.rewards.pairs import PreferencePair
from workers.reward.likelihood import crossval_accuracy


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


def test_out_of_fold_scores_do_not_carry_a_pattern_the_fit_found_in_its_own_noise() -> None:
    """Seven features, ratings they do not explain: the fit on every pair lines its scores up
    with the very ratings it trained on, so a calibration from those scores is steep and would
    carry noise into every learned reward; scored by the fold that never saw its prompt, each
    item's score follows people no better than chance, and the calibration is flat."""
    from workers.reward.likelihood import fold_weights, out_of_fold_scores
    from workers.reward.kinds.pair_fit import bradley_terry_fit
    from workers.reward.trainer import calibration_fit

    rng = random.Random(3)
    z: list[list[float]] = []
    texts: dict[tuple[str, str], int] = {}
    groups: list[str] = []
    ratings: list[float] = []
    pairs = []
    for g in range(30):
        members = []
        for m in range(2):
            texts[(f"p{g}", f"c{m}")] = len(z)
            z.append([rng.gauss(0, 1) for _ in range(7)])
            groups.append(f"p{g}")  # its prompt: the fold it falls in
            ratings.append(float(rng.random() < 0.5))
            members.append(len(z) - 1)
        a, b = members
        if ratings[a] != ratings[b]:
            chosen, rejected = (a, b) if ratings[a] > ratings[b] else (b, a)
            pairs.append(PreferencePair(prompt=f"p{g}", chosen=f"c{chosen - a}", rejected=f"c{rejected - a}",
                                        chosen_id=chosen, rejected_id=rejected, group_id=f"g{g}", kind="rating",
                                        margin=1.0))
    everything = bradley_terry_fit([z[texts[(p.prompt, p.chosen)]] for p in pairs],
                                   [z[texts[(p.prompt, p.rejected)]] for p in pairs], [1.0] * len(pairs), l2=1e-2)
    in_sample = [sum(w * x for w, x in zip(everything, f, strict=True)) for f in z]
    folds = fold_weights(z, texts, pairs, folds=4, l2=1e-2)
    out_of_fold = out_of_fold_scores(z, groups, weights=folds, folds=4, fallback=everything)
    # How far the calibrated rewards spread (people's scale is 0..1): the noise they would add.
    steep = calibration_fit(in_sample, ratings)[0] * statistics.pstdev(in_sample)
    flat = calibration_fit(out_of_fold, ratings)[0] * statistics.pstdev(out_of_fold)
    assert steep > 0.05 and flat < steep / 3, (steep, flat)


def test_an_item_of_a_group_without_pairs_is_scored_by_the_fit_on_every_pair() -> None:
    from workers.reward.likelihood import out_of_fold_scores

    # A fold that held no pair has no fit of its own: the item was in no pair, so the full fit
    # never saw it either.
    scores = out_of_fold_scores([[1.0, 2.0]], ["never-paired"], weights={}, folds=4, fallback=[0.5, 0.25])
    assert scores == [1.0]
