"""Preferences of style a run measures but never rewards (kernel/preferences.py): the
config names them under `eval.preferences`, the evaluator records the share of answers each
likes, the run page charts them apart from the reward; the demo run asks people for one."""

from __future__ import annotations

import re

import pytest

from kernel.config import ConfigInvalid, config_validate
from kernel.preferences import preference_get, preference_names, preference_register, preference_shares
from apps.runs.selectors import CHARTS

BASE = {"model": "Qwen/Qwen2.5-0.5B-Instruct", "eval": {"taskset": 1}}

ANSWERS = [
    ("What is 12 + 34?", "<answer>46</answer>"),
    ("What is 12 + 34?", "<answer>46</answer> forty-six"),
    ("What is 12 + 34?", "12 + 34 = 46 <answer>46</answer>"),
    ("What is 50 - 8?", "<answer>42</answer> forty-two"),
]


def test_a_run_measures_the_preferences_it_names_and_refuses_one_that_does_not_exist() -> None:
    cfg = config_validate(data={**BASE, "eval": {"taskset": 1, "preferences": ["in_words", "concise", "in_words"]}})
    assert cfg.eval.preferences == ["in_words", "concise"]
    with pytest.raises(ConfigInvalid) as caught:
        config_validate(data={**BASE, "eval": {"taskset": 1, "preferences": ["tone"]}})
    assert "eval.preferences" in caught.value.errors
    message = caught.value.errors["eval.preferences"]
    assert "'tone'" in message and all(name in message for name in ("concise", "working", "in_words"))


def test_the_share_is_the_part_of_the_answers_each_preference_likes() -> None:
    shares = preference_shares(["in_words", "working", "concise"], ANSWERS)
    assert shares == {"in_words": 0.5, "working": 0.25, "concise": 0.25}
    assert preference_shares(["in_words"], []) == {"in_words": 0.0}


def test_a_preference_of_ones_own_is_one_function_and_one_line() -> None:
    def polite(prompt: str, completion: str) -> int:
        return 5 if "please" in completion.lower() else 1

    preference_register("polite", title="a polite answer", rate=polite)
    try:
        assert "polite" in preference_names()
        assert config_validate(data={**BASE, "eval": {"taskset": 1, "preferences": ["polite"]}}).eval.preferences == ["polite"]
        assert preference_get("polite").liked("q", "Please: <answer>1</answer>")
    finally:
        from kernel import preferences

        preferences._REGISTRY.remove("polite")


def test_preference_shares_chart_apart_from_the_evaluation_reward() -> None:
    def group(name: str) -> str:
        return next(g["id"] for g in CHARTS if re.search(g["pattern"], name, re.IGNORECASE))

    assert group("eval/preference/in_words") == "preference"
    assert group("eval/reward_mean") == "eval" and group("eval/accuracy") == "eval"


def test_no_reward_term_reads_a_preference() -> None:
    """The easy path stays closed: what people teach is never a reward term in disguise. No
    reward is named like a preference, and no reward module imports them."""
    from pathlib import Path

    from kernel.rewards import reward_names

    assert not set(preference_names()) & set(reward_names())
    root = Path(__file__).resolve().parent.parent
    reward_modules = [*(root / "apps" / "rewards").rglob("*.py"), *(root / "workers").rglob("*reward*.py")]
    assert reward_modules
    readers = [p.relative_to(root) for p in reward_modules
               if re.search(r"runs\.preferences|runs import preferences|preference_(get|shares)", p.read_text())]
    assert readers == []
