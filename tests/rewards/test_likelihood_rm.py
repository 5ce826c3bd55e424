"""The likelihood reward model's parts: the features it reads off the base and the
Bradley-Terry fit that weighs them."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from workers.reward.likelihood import likelihood_features
from workers.reward.kinds.base_model import causal_lm_load
from workers.reward.kinds.pair_fit import bradley_terry_fit
from workers.reward.logprob_features import FEATURES



def test_bradley_terry_recovers_which_feature_people_follow() -> None:
    # People prefer the member with the larger feature 0; feature 1 is noise.
    rng = random.Random(0)
    chosen, rejected = [], []
    for _ in range(200):
        a, b = [rng.gauss(0, 1), rng.gauss(0, 1)], [rng.gauss(0, 1), rng.gauss(0, 1)]
        if a[0] < b[0]:
            a, b = b, a
        chosen.append(a)
        rejected.append(b)
    w = bradley_terry_fit(chosen, rejected, [1.0] * 200, l2=1e-3)
    assert w[0] > 1.0 and abs(w[1]) < 0.5 * w[0]


@pytest.mark.slow
def test_features_read_the_answer_span_and_the_completion_likelihood(demo_model_dir: Path) -> None:
    base = demo_model_dir
    model, tokenizer = causal_lm_load(str(base))
    tagged, bare = likelihood_features(model, tokenizer, ["What is 2 + 3?"] * 2, ["<answer>5</answer>", "5 is it"],
                                       max_length=64)
    f = dict(zip(FEATURES, tagged, strict=True))
    assert f["has_span"] == 1.0 and f["sum"] <= f["span_sum"] < 0 and f["min"] <= f["mean"] < 0
    assert dict(zip(FEATURES, bare, strict=True))["has_span"] == 0.0
    # The demo model was taught the tagged form: it is far likelier than the bare one.
    assert tagged[0] > bare[0]
    # Truncation keeps the completion (the prompt's head goes first).
    short = likelihood_features(model, tokenizer, ["What is 2 + 3? " * 20], ["<answer>5</answer>"], max_length=16)[0]
    assert short[FEATURES.index("has_span")] == 1.0
