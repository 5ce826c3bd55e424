"""The `mlp` reward-model kind (workers/reward/kinds/mlp.py): small networks on every layer's
pooled hidden states of the run's own base learn a preference no weighted sum of the features
separates (one of two words, not both and not neither), which the default `head` (a linear
head) does not; a saved version is recognised, loaded and scores as it was fitted."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from tests.rewards.one_of_two_words import base, one_of_two_pairs  # noqa: F401 (base: a fixture)

def test_the_mlp_kind_learns_one_of_two_words_that_a_linear_head_does_not(base: Path, tmp_path: Path) -> None:
    from kernel.config import RewardModelConfig
    from workers.reward.kinds import reward_kind_impl, reward_kind_of_dir
    from workers.reward.trainer import pairwise_accuracy

    rng = random.Random(0)
    train, heldout = one_of_two_pairs(rng, 160), one_of_two_pairs(rng, 80)
    accuracy = {}
    for kind in ("head", "mlp"):
        cfg = RewardModelConfig(enabled=True, kind=kind, base=str(base), max_length=64, crossval_folds=0)
        fitted = reward_kind_impl(kind).fit(cfg=cfg, base=str(base), train=train, heldout=heldout,
                                            out=tmp_path / kind, seed=0)
        accuracy[kind] = fitted.accuracy
    assert accuracy["mlp"] is not None and accuracy["mlp"] >= 0.85, accuracy
    assert accuracy["head"] is not None and accuracy["head"] <= 0.7, accuracy  # chance is 0.5

    # The saved version is an mlp one; loaded, it ranks the held-out pairs as fitted, with a spread.
    saved = reward_kind_of_dir(tmp_path / "mlp")
    assert saved.name == "mlp"
    scorer = saved.load(str(tmp_path / "mlp"), max_length=64, batch_size=16)
    prompts = [p.prompt for p in heldout]
    chosen, spread = scorer.score_spread(prompts, [p.chosen for p in heldout])
    assert spread is not None and len(spread) == len(heldout) and max(spread) > 0
    assert pairwise_accuracy(chosen, scorer.score(prompts, [p.rejected for p in heldout])) == accuracy["mlp"]

def test_a_cross_validated_mlp_version_holds_every_pair_out_once(base: Path, tmp_path: Path) -> None:
    """With folds, the accuracy is out of fold over every pair, and each item is ranked by the
    networks that never saw its prompt."""
    from kernel.config import RewardModelConfig
    from workers.reward.kinds import reward_kind_impl

    pairs = one_of_two_pairs(random.Random(1), 120)
    cfg = RewardModelConfig(enabled=True, kind="mlp", base=str(base), max_length=64)
    assert cfg.crossval_folds == 4  # the default of a kind that declares crossval
    fitted = reward_kind_impl("mlp").fit(cfg=cfg, base=str(base), train=pairs[:90], heldout=pairs[90:],
                                         out=tmp_path / "v", seed=0)
    assert fitted.heldout == fitted.train and len(fitted.train) == 120
    assert fitted.accuracy is not None and fitted.accuracy >= 0.75, fitted.accuracy
    assert fitted.out_of_fold is not None and all(fitted.out_of_fold.fold_fitted(p.prompt) for p in pairs)
    scores = fitted.out_of_fold.score_out_of_fold([p.prompt for p in pairs[:4]], [p.chosen for p in pairs[:4]],
                                                  [p.prompt for p in pairs[:4]])
    assert len(scores) == 4
