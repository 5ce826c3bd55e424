"""What a learner gang cannot run (fp16's loss scaler, hosts that do not split the ranks
evenly, a sharding that does not exist) is refused in the run config, naming the field; every
algorithm and loss type may run as one. The config alone: no database, no process (the gangs
themselves are tests/trainer/test_learner_gang_task.py's)."""

from __future__ import annotations

from typing import Any

import pytest

from kernel.config import ConfigInvalid, config_validate


@pytest.mark.parametrize(("config", "message"), [
    ({"trainer": {"processes": 2, "precision": "fp16"}}, "processes: fp16's loss scaler is one process's"),
    ({"trainer": {"processes": 3, "hosts": 2}}, "hosts: 3 processes do not split evenly over 2 hosts"),
])
def test_a_learner_gang_that_cannot_run_is_refused_in_the_config_naming_the_field(
    config: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigInvalid) as refused:
        config_validate(data={"model": "m", **config})
    assert refused.value.errors["trainer"].startswith(message)


@pytest.mark.parametrize("trainer", [
    {"processes": 2, "loss_type": "cispo"}, {"processes": 2, "scale_rewards": "batch"},
    {"processes": 4, "hosts": 2, "sharding": "grad_op"}, {"processes": 2, "sharding": "none", "precision": "bf16"},
])
@pytest.mark.parametrize("algorithm", ["grpo", "dpo", "sft", "mix"])
def test_every_algorithm_and_loss_type_may_run_as_a_learner_gang(algorithm: str, trainer: dict[str, Any]) -> None:
    cfg = config_validate(data={"model": "m", "algorithm": algorithm, "trainer": trainer})
    assert cfg.trainer.processes == trainer["processes"]


def test_a_sharding_that_does_not_exist_is_refused_naming_the_field() -> None:
    with pytest.raises(ConfigInvalid) as refused:
        config_validate(data={"model": "m", "trainer": {"processes": 2, "sharding": "zero3"}})
    assert "trainer.sharding" in refused.value.errors
