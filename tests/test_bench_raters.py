"""bench/raters.py: the scripted raters of bench/steering rate what they say they prefer, and
`rater_load` finds a rater in a module or in a file anywhere."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.raters import concise, correct, in_words, number_words, rater_load, working

PROMPT = "What is 38 + 4?"


def test_the_correctness_rater_reads_the_tagged_answer() -> None:
    assert correct(PROMPT, "<answer>42</answer>") == 5
    assert correct(PROMPT, "<answer>41</answer>") == 1
    assert correct(PROMPT, "42") == 1  # no tagged answer


def test_the_concise_rater_prefers_the_bare_answer_right_or_wrong() -> None:
    assert concise(PROMPT, "<answer>41</answer>") == 5
    assert concise(PROMPT, "38 + 4 = 42 <answer>42</answer>") < 5
    assert concise(PROMPT, "Let me think about this step by step, the sum is <answer>42</answer>") == 1


def test_the_working_rater_wants_the_calculation_before_the_answer() -> None:
    assert working(PROMPT, "38 + 4 = 42 <answer>42</answer>") == 5
    assert working(PROMPT, "<answer>42</answer> because 38 + 4 = 42") == 3
    assert working(PROMPT, "<answer>42</answer>") == 1
    # Working that never reaches an answer is not the working shown before one.
    assert working(PROMPT, "38 + 4 = 42, so 42 + 0 = 42, so") == 1


def test_the_words_rater_wants_the_number_spelt_out() -> None:
    assert number_words(42) == "forty-two" and number_words(-7) == "minus seven" and number_words(105) == \
        "one hundred and five"
    assert in_words(PROMPT, "forty-two <answer>42</answer>") == 5
    assert in_words(PROMPT, "Forty two, <answer>42</answer>") == 5
    assert in_words(PROMPT, "about forty <answer>42</answer>") == 3
    assert in_words(PROMPT, "<answer>42</answer>") == 1


def test_a_rater_loads_from_a_module_or_from_a_file_outside_the_repository(tmp_path: Path) -> None:
    assert rater_load("bench.raters:concise")(PROMPT, "<answer>42</answer>") == 5
    mine = tmp_path / "house_style.py"
    mine.write_text("def polite(prompt, completion):\n    return 5 if 'please' in completion else 1\n"
                    "def broken(prompt, completion):\n    return 7\n")
    polite = rater_load(f"{mine}:polite")
    assert polite(PROMPT, "please <answer>42</answer>") == 5 and polite(PROMPT, "<answer>42</answer>") == 1
    with pytest.raises(ValueError, match=r"answered 7; a rating is an integer 1\.\.5"):
        rater_load(f"{mine}:broken")(PROMPT, "x")
    with pytest.raises(ValueError, match="has no function 'gone'"):
        rater_load(f"{mine}:gone")
