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


def test_a_drawn_preference_is_the_same_for_the_same_seed_and_differs_between_seeds() -> None:
    """Deterministic per seed (random.Random on a string, no hash()): the same description and
    the same ratings twice, in this process and the bench's."""
    from bench.raters import preference_draw, probes

    examples = probes()
    for seed in (0, 7, 123):
        a, b = preference_draw(seed), preference_draw(seed)
        assert a == b and a.describe() == b.describe()
        assert [a(p, c) for p, c in examples] == [b(p, c) for p, c in examples]
    described = {preference_draw(seed).describe().split(": ", 1)[1] for seed in range(40)}
    assert len(described) == 40  # no two of 40 seeds draw the same preference


def test_the_family_covers_each_part_of_its_space_over_200_draws() -> None:
    """Likes and dislikes of each form the demo model writes, of a phrase, of a length band;
    combinations; combinations with a right answer; partial credit; every scale, both folds;
    noise and none. Each part at least a few times in 200 draws, none dominating all."""
    from collections import Counter

    from bench.raters import FORMS, SCALES, preference_draw

    counts: Counter[str] = Counter()
    for seed in range(200):
        counts.update(preference_draw(seed).kinds)
    wanted = [f"form-{how}:{form}" for how in ("like", "dislike") for form in FORMS[:4]]
    wanted += ["phrase-like", "phrase-dislike", "length-like", "length-dislike", "combination", "with-correctness",
               "partial-credit", "noise", "fold:mean", "fold:least"] + [f"scale:{s}" for s in SCALES]
    assert {k: counts[k] for k in wanted if counts[k] < 5} == {}, counts
    assert 30 <= counts["with-correctness"] <= 120 and 200 - counts["noise"] >= 30, counts


def test_every_drawn_rater_gives_every_rating_on_what_the_demo_model_writes() -> None:
    """A drawn person uses the whole scale: each rating 1..5 for some completion written in the
    demo model's forms (a generated rater is not a 1-or-5 switch)."""
    from bench.raters import form_of, preference_draw, probes

    examples = probes()
    assert {form_of(c) for _, c in examples} == {"bare", "working", "words", "preamble", "untagged"}
    for seed in range(200):
        rater = preference_draw(seed)
        assert {rater(p, c) for p, c in examples} == {1, 2, 3, 4, 5}, rater.describe()


def test_a_drawn_preference_rates_by_what_its_description_says() -> None:
    """The parts read what the page shows: a form, a phrase, a length, the right answer."""
    from bench.raters import CorrectPart, FormPart, GeneratedRater, LengthPart, PhrasePart, form_of, preference_draw

    assert form_of("<answer>42</answer>") == "bare" and form_of("38 + 4 = 42, so <answer>42</answer>") == "working"
    assert form_of("42 is forty-two, so <answer>42</answer>") == "words"
    assert form_of("So the answer is <answer>42</answer>") == "preamble" and form_of("42") == "untagged"
    likes_working = FormPart(credit=(("bare", 0.0), ("working", 1.0), ("words", 0.5), ("preamble", 0.25),
                                     ("untagged", 0.0)), target="working", like=True)
    mixed = GeneratedRater(seed=-1, parts=((likes_working, 1), (CorrectPart(tolerance=0), 1)), fold="mean",
                           scale="even", cuts=(0.125, 0.375, 0.625, 0.875), noise=0.0)
    assert mixed(PROMPT, "38 + 4 = 42, so <answer>42</answer>") == 5  # both
    assert mixed(PROMPT, "38 + 4 = 41, so <answer>41</answer>") == 3  # the form only
    assert mixed(PROMPT, "<answer>42</answer>") == 3  # the answer only
    assert mixed(PROMPT, "<answer>41</answer>") == 1  # neither
    assert "likes the working shown first" in mixed.describe() and "likes the right answer" in mixed.describe()
    assert PhrasePart(phrase="so", like=False, need=1)(PROMPT, "So the answer is <answer>42</answer>") == 0.0
    assert LengthPart(low=0, high=4, falloff=0.1, like=True)(PROMPT, "<answer>42</answer>") == 1.0
    assert rater_load("generated:3") == preference_draw(3)
    with pytest.raises(ValueError, match="generated:SEED"):
        rater_load("generated:x")


def _row(rater: str, seed: int, arm: str, share_gain: float, arithmetic: float, *, labels: int, load: float,
         rm_acc: float | None = None) -> dict[str, object]:
    return {"rater": rater, "seed": seed, "arm": arm, "share_gain": share_gain, "arithmetic": arithmetic,
            "labels": labels, "load": load, "rm_acc": rm_acc}


def test_the_family_summary_reads_each_target_off_the_rows(capsys: pytest.CaptureFixture[str]) -> None:
    """bench/steering's family lines, recomputed here from the rows: rm10/all per pair (pairs
    where `all` gained <= 0.02 counted apart), its median and 25th percentile (linear between
    order statistics), the worst pair with its preference written out, the share met."""
    import argparse
    import statistics

    from bench.steering.people import RaterSpec
    from bench.steering.report import family_pairs, family_summary

    rows = []
    gains = {("generated:0", 0): (0.40, 0.36), ("generated:0", 1): (0.30, 0.15), ("generated:1", 0): (0.20, 0.19),
             ("generated:1", 1): (0.01, 0.05)}  # the last: no ceiling
    for (rater, seed), (every, rm10) in gains.items():
        rows += [_row(rater, seed, "all", every, 0.20, labels=960, load=3.0),
                 _row(rater, seed, "rm10", rm10, 0.19 if seed else 0.15, labels=90, load=4.5, rm_acc=0.9),
                 _row(rater, seed, "random10", 0.02, 0.2, labels=90, load=2.0),
                 _row(rater, seed, "format", -0.01, 0.2, labels=0, load=2.5)]
    pairs = family_pairs(rows)
    ratios = sorted(p["ratio"] for p in pairs if p.get("ratio") is not None)
    assert ratios == pytest.approx(sorted([0.36 / 0.40, 0.15 / 0.30, 0.19 / 0.20]))
    q1 = ratios[0] + (ratios[1] - ratios[0]) * 0.5  # (n - 1) * 0.25 = 0.5
    raters = [RaterSpec(name=f"generated:{i}", rating=lambda p, c: 3, noise=0.0, description=f"preference {i}",
                        mixed=i == 1) for i in (0, 1)]
    family_summary(raters, rows, seeds=[0, 1], args=argparse.Namespace(steps=30, seeds="0,1"))
    out = capsys.readouterr().out
    assert f"rm10/all share gain: median {statistics.median(ratios):+.3f}, 25th percentile {q1:+.3f}, worst " \
           f"{0.5:+.3f} (generated:0 seed 1: preference 0); met 2/3 pairs" in out
    assert "1 pairs where `all` gained <= 0.02" in out and "generated:1 s1 all +0.010 rm10 +0.050" in out
    assert f"rm10/all labels: at most {90 / 960:.3f}" in out
    assert "rm10 - random10 share gain: median +0.150" in out and "met 4/4 pairs" in out  # 0.34 0.13 0.17 0.03
    # arithmetic against format: -0.05 on seed 0's pairs, -0.01 on seed 1's: median -0.03, 2 of 4 met
    assert "rm10 - format sampled arithmetic: median -0.030, 25th percentile -0.050" in out and "met 2/4 pairs" in out
    assert "generated:1 s0 rm10 +0.190 all +0.200 ratio 0.95 rm held-out accuracy 0.90" in out
    assert f"family verdict: rm10/all median {statistics.median(ratios):.2f} (>= 0.8), 25th percentile {q1:.2f}" \
           " (>= 0.6) on 3 pairs" in out and "load 2.0-4.5" in out
