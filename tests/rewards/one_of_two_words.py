"""A preference no weighted sum of a frozen base's features separates (one of two words, not
both and not neither), and a tiny base that has seen the words: shared by the reward kinds'
tests that must learn more than a linear head (tests/rewards/test_mlp_reward_kind.py,
test_lora_reward_kind.py)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from apps.rewards.pairs import PreferencePair

WORDS = ("apple", "stone")
FILLER = ("the", "sum", "we", "get", "so", "it", "is", "then")


def word_completion(rng: random.Random, a: int, b: int, *, apple: bool, stone: bool) -> str:
    # Always six words around the answer: the words differ, the length does not.
    words = [w for w, on in zip(WORDS, (apple, stone), strict=True) if on]
    words += rng.sample(FILLER, 6 - len(words))
    rng.shuffle(words)
    return " ".join(words) + f" <answer>{a + b}</answer>"


def one_of_two_pairs(rng: random.Random, n: int) -> list[PreferencePair]:
    """One of the two words (either) over both or neither, on prompts of their own."""
    out = []
    for i in range(n):
        a, b = rng.randint(0, 99), rng.randint(0, 9)
        one = rng.random() < 0.5
        chosen = word_completion(rng, a, b, apple=one, stone=not one)
        both = rng.random() < 0.5
        rejected = word_completion(rng, a, b, apple=both, stone=both)
        out.append(PreferencePair(prompt=f"What is {a} + {b}? ({i})", chosen=chosen, rejected=rejected, chosen_id=2 * i,
                                  rejected_id=2 * i + 1, group_id=f"g{i}", kind="rating", margin=1.0))
    return out


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from workers.models.tiny import tiny_model_save

    texts = [f"What is {a} + {b}? " + " ".join(WORDS + FILLER) + f" <answer>{a + b}</answer>"
             for a in range(40) for b in range(10)]
    return tiny_model_save(tmp_path_factory.mktemp("base") / "m", texts=texts, hidden_size=32, layers=2, heads=2)
