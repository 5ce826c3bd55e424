"""The `lora` reward-model kind (workers/reward/kinds/lora.py): the run's own base fine-tuned
with a LoRA adapter under a scalar head learns a preference that no weighted sum of the frozen
base's features separates (one of two words, not both and not neither), where the default
`head` stays near chance; a saved version is recognised, loaded and scores as it was fitted,
and the resident base the other kinds share is left as it was."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from tests.rewards.one_of_two_words import base, one_of_two_pairs  # noqa: F401 (base: a fixture)

def test_the_lora_kind_learns_one_of_two_words_that_a_linear_head_does_not(base: Path, tmp_path: Path) -> None:
    import torch

    from kernel.config import RewardModelConfig
    from workers.reward.kinds.base_model import causal_lm_load
    from workers.reward.kinds import reward_kind_impl, reward_kind_of_dir
    from workers.reward.trainer import pairwise_accuracy

    resident = causal_lm_load(str(base))[0]
    before = {k: v.clone() for k, v in resident.state_dict().items()}
    rng = random.Random(0)
    train, heldout = one_of_two_pairs(rng, 160), one_of_two_pairs(rng, 80)
    accuracy = {}
    for kind in ("head", "lora"):
        # 16 passes: this tiny random base needs more than the config's default 4.
        cfg = RewardModelConfig(enabled=True, kind=kind, base=str(base), max_length=64, crossval_folds=0,
                                epochs=16)
        fitted = reward_kind_impl(kind).fit(cfg=cfg, base=str(base), train=train, heldout=heldout,
                                            out=tmp_path / kind, seed=0)
        assert fitted.heldout == heldout
        accuracy[kind] = fitted.accuracy
    assert accuracy["lora"] is not None and accuracy["lora"] >= 0.85, accuracy
    assert accuracy["head"] is not None and accuracy["head"] <= 0.7, accuracy  # chance is 0.5

    # The shared resident base (head's, mlp's, likelihood's) carries no adapter and kept its weights.
    assert not any("lora_" in k for k in resident.state_dict())
    assert all(torch.equal(v, before[k]) for k, v in resident.state_dict().items())

    # The saved version is a lora one; loaded, it ranks the held-out pairs as fitted.
    saved = reward_kind_of_dir(tmp_path / "lora")
    assert saved.name == "lora"
    scorer = saved.load(str(tmp_path / "lora"), max_length=64, batch_size=16)
    prompts = [p.prompt for p in heldout]
    chosen, spread = scorer.score_spread(prompts, [p.chosen for p in heldout])
    assert spread is None  # one fit, no ensemble
    assert pairwise_accuracy(chosen, scorer.score(prompts, [p.rejected for p in heldout])) == accuracy["lora"]

def test_lora_declares_no_folds() -> None:
    """Folds would be one fine-tuning each: unset they are 0 for lora, asked for they are refused."""
    from kernel.config import ConfigInvalid, RewardModelConfig, config_validate

    assert RewardModelConfig(enabled=True, kind="lora").crossval_folds == 0
    with pytest.raises(ConfigInvalid) as caught:
        config_validate(data={"model": "m", "reward_model": {"kind": "lora", "crossval_folds": 4}})
    assert "reward_model" in caught.value.errors
