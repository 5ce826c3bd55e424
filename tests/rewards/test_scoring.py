"""Routing by domain, weighted combination, and run validation of reward specs."""

from __future__ import annotations

import pytest

from apps.rewards.scoring import (
    reward_combine,
    rewards_awaiting,
    rewards_inline,
    rewards_remote_terms,
    term_keys,
)
from kernel.config import ConfigInvalid, RewardTerm, config_validate

MATH = {"domain": "math", "prompt": "What is 12 + 7?", "reference": "19"}
CODE = {"domain": "code", "prompt": "Write add.", "tests": ["assert add(1, 2) == 3"]}
GENERAL = {"domain": "general", "prompt": "Capital of France?", "reference": "Paris"}


def _terms(*specs: dict) -> list[RewardTerm]:
    return list(config_validate(data={"model": "m", "rewards": list(specs)}).rewards)


def test_an_empty_spec_routes_math_to_accuracy_and_format() -> None:
    good = rewards_inline(terms=[], completion="<answer>19</answer>", task=MATH)
    assert good.parts == {"math_accuracy": 1.0, "math_format": 1.0}
    assert good.score == pytest.approx(1.1)
    untagged = rewards_inline(terms=[], completion="19", task=MATH)
    assert untagged.parts == {"math_accuracy": 1.0, "math_format": 0.0}
    wrong = rewards_inline(terms=[], completion="<answer>20</answer>", task=MATH)
    assert wrong.score == pytest.approx(0.1)


def test_an_empty_spec_sends_code_to_the_reward_queue_and_anything_else_to_exact_match() -> None:
    assert rewards_inline(terms=[], completion="def add(a, b): return a + b", task=CODE).parts == {}
    assert rewards_awaiting(terms=[], task=CODE) == ["code_exec"]
    assert rewards_awaiting(terms=[], task=MATH) == []
    assert [t.name for t in rewards_remote_terms([])] == ["code_exec", "k12_judge"]
    assert rewards_inline(terms=[], completion="Paris", task=GENERAL).parts == {"exact_match": 1.0}
    assert rewards_inline(terms=[], completion="Lyon", task={**GENERAL, "domain": "trivia"}).score == 0.0


def test_a_term_applies_only_to_its_domains() -> None:
    terms = _terms(
        {"name": "math_accuracy", "weight": 2.0, "domains": ["math"]},
        {"name": "exact_match", "domains": ["general"]},
        {"name": "length_penalty", "weight": 0.5, "params": {"max_chars": 10}},
    )
    math = rewards_inline(terms=terms, completion="<answer>19</answer> and some more", task=MATH)
    assert set(math.parts) == {"math_accuracy", "length_penalty"}
    assert math.score == pytest.approx(2.0 * 1.0 + 0.5 * math.parts["length_penalty"])
    assert math.parts["length_penalty"] < 0
    general = rewards_inline(terms=terms, completion="Paris", task=GENERAL)
    assert general.parts == {"exact_match": 1.0, "length_penalty": 0.0}
    assert general.score == 1.0


def test_a_repeated_reward_name_gets_numbered_parts() -> None:
    terms = _terms(
        {"name": "regex", "params": {"pattern": "<answer>"}},
        {"name": "regex", "weight": -1.0, "params": {"pattern": "sorry"}},
    )
    assert term_keys(terms) == ["regex", "regex#2"]
    result = rewards_inline(terms=terms, completion="sorry, <answer>19</answer>", task=MATH)
    assert result.parts == {"regex": 1.0, "regex#2": 1.0}
    assert result.score == 0.0


def test_remote_terms_are_left_to_the_reward_queue_and_combined_later() -> None:
    terms = _terms(
        {"name": "math_format", "weight": 0.5},
        {"name": "code_exec", "weight": 2.0, "domains": ["code"]},
        {"name": "reward_model", "weight": 0.25, "params": {"model": "/models/rm"}},
    )
    assert [t.name for t in rewards_remote_terms(terms)] == ["code_exec", "reward_model"]
    assert rewards_awaiting(terms=terms, task=CODE) == ["code_exec", "reward_model"]
    assert rewards_awaiting(terms=terms, task=MATH) == ["reward_model"]
    inline = rewards_inline(terms=terms, completion="<answer>x</answer>", task=CODE)
    assert inline.parts == {"math_format": 1.0}
    parts = {**inline.parts, "code_exec": 0.5, "reward_model": 2.0, "not_a_term": 100.0}
    assert reward_combine(terms=terms, parts=parts) == pytest.approx(0.5 + 1.0 + 0.5)


def test_an_unknown_reward_name_fails_run_validation_naming_it() -> None:
    with pytest.raises(ConfigInvalid) as caught:
        config_validate(data={"model": "m", "rewards": [{"name": "math_accuracy"}, {"name": "math_acuracy"}]})
    assert "math_acuracy" in caught.value.errors["rewards.1.name"]
    assert "math_accuracy" in caught.value.errors["rewards.1.name"]  # the known names are listed


@pytest.mark.parametrize(
    ("term", "message"),
    [
        ({"name": "regex", "params": {"pattern": "(unclosed"}}, "does not compile"),
        ({"name": "regex"}, "needs params.pattern"),
        ({"name": "reward_model"}, "needs params.model"),
        ({"name": "llm_judge", "params": {"engine": "magic"}}, "engine must be one of"),
        ({"name": "llm_judge", "params": {"template": "no slot"}}, "{completion}"),
        ({"name": "code_exec", "params": {"timeout": 0}}, "timeout must be"),
        ({"name": "length_penalty", "params": {"max_chars": -5}}, "max_chars must be"),
    ],
)
def test_bad_reward_params_fail_run_validation(term: dict, message: str) -> None:
    with pytest.raises(ConfigInvalid) as caught:
        config_validate(data={"model": "m", "rewards": [term]})
    assert any(message in m for m in caught.value.errors.values()), caught.value.errors


def test_a_reward_function_that_breaks_scores_zero_not_an_exception() -> None:
    # Bypasses validation on purpose: a term built without params.pattern crashes nothing.
    term = RewardTerm.model_construct(name="regex", weight=1.0, params={"pattern": "("}, domains=[])
    assert rewards_inline(terms=[term], completion="x", task=MATH).parts == {"regex": 0.0}
