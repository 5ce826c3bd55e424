"""bench/demo_teach's held-out answers split by a style: the share and the arithmetic in and out
of it, counted here by hand from the answers."""

from __future__ import annotations

from bench.demo_teach import StyleSplit, style_split
from kernel.preferences import preference_get

WORKING = preference_get("working").liked


def test_the_split_counts_each_side_by_hand() -> None:
    samples = [
        ("What is 12 + 34?", "12 + 34 = 46, so <answer>46</answer>"),  # working, right
        ("What is 12 + 34?", "12 + 34 = 47, so <answer>47</answer>"),  # working, wrong
        ("What is 12 + 34?", "<answer>46</answer>"),  # bare, right
        ("What is 2 + 3?", "<answer>6</answer>"),  # bare, wrong
        ("What is 2 + 3?", "<answer>7</answer>"),  # bare, wrong
    ]
    assert [WORKING(p, c) for p, c in samples] == [True, True, False, False, False]
    split = style_split(samples, WORKING)
    assert split == StyleSplit(share=2 / 5, inside=1 / 2, outside=1 / 3)
    assert str(split) == "0.400; 0.500 / 0.333"


def test_a_side_without_answers_reads_as_a_dash() -> None:
    split = style_split([("What is 2 + 3?", "<answer>5</answer>")], WORKING)
    assert split == StyleSplit(share=0.0, inside=None, outside=1.0)
    assert str(split) == "0.000; - / 1.000"
