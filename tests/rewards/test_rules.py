"""Rule rewards on good and bad answers: exact match, regex, length penalty, math, format."""

from __future__ import annotations

import pytest

from apps.rewards.answers import answer_extract
from apps.rewards.builtin_rules import exact_match, length_penalty, regex
from apps.rewards.math_rules import answers_equivalent, math_accuracy, math_format

MATH = {"domain": "math", "prompt": "What is 12 + 7?", "reference": "19"}
HUGE = "7 " * 2_500_000  # 5 MB of output


@pytest.mark.parametrize(
    ("completion", "score"),
    [
        ("<answer>19</answer>", 1.0),
        ("Let me add: 12 + 7 = 19. <answer> 19 </answer>", 1.0),
        ("<answer>19.0</answer>", 1.0),
        ("<answer>\\frac{38}{2}</answer>", 1.0),
        ("<answer>$19$</answer>", 1.0),
        ("The answer is \\boxed{19}", 1.0),
        ("<answer>18</answer>", 0.0),
        ("<answer>19</answer> wait, no: <answer>20</answer>", 0.0),
        ("<answer>nineteen</answer>", 0.0),
        ("<answer></answer>", 0.0),
        ("<answer>19", 0.0),
        ("", 0.0),
        ("<answer>)(*&^%$#@!{}</answer>", 0.0),
        ("<answer>" + "9" * 5000 + "</answer>", 0.0),
    ],
)
def test_math_accuracy_rewards_only_an_equivalent_answer(completion: str, score: float) -> None:
    result = math_accuracy(completion, MATH)
    assert result.score == score
    assert result.parts == {"math_accuracy": score}


def test_math_accuracy_accepts_a_reference_in_a_mapping_and_symbolic_answers() -> None:
    task = {"domain": "math", "reference": {"answer": "\\frac{1}{2}"}}
    assert math_accuracy("<answer>0.5</answer>", task).score == 1.0
    assert math_accuracy("<answer>1/2</answer>", task).score == 1.0
    assert math_accuracy("<answer>2/3</answer>", task).score == 0.0


def test_math_accuracy_can_require_the_tags() -> None:
    assert math_accuracy("19", MATH).score == 1.0
    assert math_accuracy("19", MATH, require_tags=True).score == 0.0


@pytest.mark.parametrize(
    ("gold", "answer", "ok", "how"),
    [
        ("19", "19", True, "integer"),
        ("-3", "-03", True, "integer"),
        ("19", "18", False, "integer"),
        ("1,000", "1000", True, "math_verify"),
        ("-3", "-3.0", True, "math_verify"),
        ("19", "18.5", False, "numeric"),
        ("x+1", "1+x", True, "math_verify"),
        ("x+1", "x+2", False, "math_verify"),
        ("@home", "@Home", True, "exact"),
        ("#red", "#blue", False, "exact"),
        ("19", "", False, "empty"),
    ],
)
def test_answers_equivalent_falls_back_when_parsing_fails(gold: str, answer: str, ok: bool, how: str) -> None:
    assert answers_equivalent(gold=gold, answer=answer) == (ok, how)


@pytest.mark.timeout(20)
def test_math_rewards_handle_a_huge_output() -> None:
    assert math_accuracy(HUGE, MATH).score == 0.0
    assert math_format(HUGE, MATH).score == 0.0
    assert math_accuracy(HUGE + "<answer>19</answer>", MATH).score == 1.0
    assert math_format(HUGE + "<answer>19</answer>", MATH).score == 1.0


@pytest.mark.parametrize(
    ("completion", "score"),
    [
        ("<answer>19</answer>", 1.0),
        ("12 + 7 is 19 so <answer>19</answer>", 1.0),
        ("<answer>19</answer> trailing words", 1.0),
        ("19", 0.0),
        ("<answer>19", 0.0),
        ("19</answer>", 0.0),
        ("</answer>19<answer>", 0.0),
        ("<answer>  </answer>", 0.0),
        ("<answer>1</answer><answer>2</answer>", 0.0),
        ("<answer><answer>19</answer>", 0.0),
        ("<ANSWER>19</ANSWER>", 0.0),
    ],
)
def test_math_format_wants_exactly_one_non_empty_tag_pair(completion: str, score: float) -> None:
    assert math_format(completion, MATH).score == score


def test_strict_format_wants_nothing_after_the_answer() -> None:
    assert math_format("<answer>19</answer>\n", MATH, strict=True).score == 1.0
    assert math_format("<answer>19</answer> trailing", MATH, strict=True).score == 0.0


def test_answer_extract_takes_the_last_well_formed_pair() -> None:
    assert answer_extract("<answer>1</answer> <answer> 2 </answer>") == "2"
    assert answer_extract("<answer> a <answer>b</answer>") == "b"
    assert answer_extract("<answer>unclosed") is None


@pytest.mark.parametrize(
    ("completion", "params", "score"),
    [
        ("19", {}, 1.0),
        ("  19\n", {}, 1.0),
        ("<answer>19</answer>", {}, 1.0),
        ("<answer>19</answer>", {"use_answer_tag": False}, 0.0),
        ("20", {}, 0.0),
        ("", {}, 0.0),
    ],
)
def test_exact_match_compares_the_answer_with_the_reference(completion: str, params: dict, score: float) -> None:
    assert exact_match(completion, MATH, **params).score == score


def test_exact_match_case_sensitivity_is_a_param() -> None:
    task = {"domain": "general", "reference": "Paris"}
    assert exact_match("paris", task).score == 0.0
    assert exact_match("paris", task, case_sensitive=False).score == 1.0


def test_regex_matches_searches_or_the_whole_completion() -> None:
    assert regex("result: 42 done", MATH, pattern=r"\d+").score == 1.0
    assert regex("no digits", MATH, pattern=r"\d+").score == 0.0
    assert regex("result: 42", MATH, pattern=r"\d+", fullmatch=True).score == 0.0
    assert regex(" 42 ", MATH, pattern=r"\d+", fullmatch=True).score == 1.0


@pytest.mark.parametrize(
    ("length", "expected"), [(10, 0.0), (100, 0.0), (150, -0.5), (200, -1.0), (5_000_000, -1.0)]
)
def test_length_penalty_grows_past_the_limit_and_is_floored(length: int, expected: float) -> None:
    result = length_penalty("x" * length, MATH, max_chars=100)
    assert result.score == pytest.approx(expected)
    assert result.parts == {"length_penalty": pytest.approx(expected)}
