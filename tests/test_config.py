from __future__ import annotations

import pytest

from kernel.config import ConfigInvalid, config_parse, config_validate


def test_a_minimal_config_gets_defaults() -> None:
    cfg = config_validate(data={"model": "Qwen/Qwen2.5-0.5B"})
    assert cfg.algorithm == "grpo" and cfg.mode == "sync" and cfg.repeat_times == 4
    assert cfg.feedback.mode == "auto" and cfg.replay.max_uses == 1


def test_a_reward_model_cross_validates_by_default_where_its_kind_can() -> None:
    def folds(**rm: object) -> int:
        return config_validate(data={"model": "m", "reward_model": rm}).reward_model.crossval_folds

    assert folds() == folds(kind="likelihood") == 4  # head is the default kind
    assert folds(kind="classifier") == 0  # no folds: its split is by prompt
    assert folds(kind="head", crossval_folds=0) == 0 and folds(crossval_folds=6) == 6
    # The stored config says what it ran with, and reads back the same.
    cfg = config_validate(data={"model": "m"})
    assert config_validate(data=cfg.model_dump()).reward_model.crossval_folds == 4


@pytest.mark.parametrize(
    ("data", "field", "message"),
    [
        ({}, "model", "Model is required"),
        ({"model": "m", "algorithm": "ppo"}, "algorithm", "Algorithm must be one of the registered algorithms"),
        ({"model": "m", "sampling": {"temperature": -1}}, "sampling.temperature", "Temperature must be at least 0"),
        ({"model": "m", "sampling": {"temprature": 1}}, "sampling.temprature", "unknown key 'temprature'"),
        ({"model": "m", "colour": "red"}, "colour", "unknown key 'colour'"),
        ({"model": "m", "rewards": [{"name": "nope"}]}, "rewards.0.name", "unknown reward 'nope'"),
        ({"model": "m", "repeat_times": 1}, "repeat_times", "repeat_times must be at least 2"),
        ({"model": "m", "feedback": {"mode": "learned"}}, "feedback.mode", "needs reward_model.enabled"),
        ({"model": "m", "feedback": {"mode": "blend", "w_auto": 0, "w_human": 0}}, "feedback", "w_auto + w_human > 0"),
        ({"model": "m", "reward_model": {"kind": "value_head"}}, "reward_model.kind",
         "registered reward-model kinds: head, likelihood, mlp, lora, classifier"),
        ({"model": "m", "reward_model": {"answer_pattern": "<answer>(.*"}}, "reward_model.answer_pattern",
         "not a regular expression"),
        ({"model": "m", "reward_model": {"crossval_folds": 1}}, "reward_model.crossval_folds", "at least 2 folds"),
        ({"model": "m", "reward_model": {"kind": "classifier", "crossval_folds": 4}}, "reward_model",
         "kinds 'head', 'likelihood', 'mlp' only"),
    ],
)
def test_a_bad_config_names_the_bad_field(data: dict, field: str, message: str) -> None:
    with pytest.raises(ConfigInvalid) as caught:
        config_validate(data=data)
    assert field in caught.value.errors, caught.value.errors
    assert message in caught.value.errors[field]


def test_a_config_file_with_an_unknown_key_fails_naming_the_key() -> None:
    with pytest.raises(ConfigInvalid, match="unknown key 'max_stalness'"):
        config_parse(text="model: m\nmax_stalness: 2\n", filename="run.yaml")


def test_json_and_yaml_files_parse_to_the_same_config() -> None:
    yaml_cfg = config_parse(text="model: m\nmode: async\nmax_staleness: 2\n", filename="run.yaml")
    json_cfg = config_parse(text='{"model": "m", "mode": "async", "max_staleness": 2}', filename="run.json")
    assert yaml_cfg == json_cfg


def test_a_broken_file_says_so() -> None:
    with pytest.raises(ConfigInvalid, match="not valid YAML"):
        config_parse(text="model: [unclosed", filename="run.yaml")
    with pytest.raises(ConfigInvalid, match="must be a mapping"):
        config_parse(text="- just a list", filename="run.yaml")
