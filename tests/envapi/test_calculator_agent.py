"""The example agent's tool and reward (the whole agent runs in tests/learning/test_calculator_agent.py)."""

from __future__ import annotations

import pytest

from examples.calculator_agent import calc, main, reward_of


@pytest.mark.parametrize("expression,result", [("2+3", "5"), ("7 - 10", "-3"), ("6*7", "42"), ("1/4", "0.25"), ("-2*-2", "4")])
def test_the_calculator_evaluates_arithmetic(expression: str, result: str) -> None:
    assert calc(expression) == result


@pytest.mark.parametrize("expression", ["__import__('os').system('true')", "2**100000", "x+1", "1/0", "9" * 300])
def test_the_calculator_refuses_anything_else_without_evaluating_it(expression: str) -> None:
    assert calc(expression).startswith("error:")


def test_the_environment_rewards_the_right_number_in_tags() -> None:
    assert reward_of("<answer>12</answer>", "12") == (1.1, {"correct": 1.0, "format": 0.1})
    assert reward_of("<answer>13</answer>", 12) == (0.1, {"correct": 0.0, "format": 0.1})
    assert reward_of("12", "12") == (0.0, {"correct": 0.0, "format": 0.0})


def test_the_cli_says_what_is_missing(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RFT_API_KEY", raising=False)
    with pytest.raises(SystemExit) as exit_:
        main(["--run", "1"])
    assert exit_.value.code == 2 and "--key" in capsys.readouterr().err
