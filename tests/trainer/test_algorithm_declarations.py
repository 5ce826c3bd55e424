"""The web side's declaration of each algorithm and its objective on the worker side agree
(one test, so the two never drift apart), and `trainer.params` is per algorithm: configs
of the old flat shape still load, and stored runs' configs are migrated to the new one."""

from __future__ import annotations

import importlib
from typing import Any

import pytest

from kernel.algorithms import algorithm_get, algorithm_names, algorithms
from kernel.algorithms.dpo import DPOParams
from kernel.algorithms.grpo import GRPOParams
from kernel.algorithms.mix import MIXParams
from kernel.config import config_dump, config_validate

MIGRATION = importlib.import_module("apps.runs.migrations.0010_trainer_params")


@pytest.mark.parametrize("name", ["grpo", "dpo", "sft", "mix"])
def test_each_declaration_names_an_objective_of_its_name_that_shards_as_declared(name: str) -> None:
    from workers.algorithms.objectives import objective_class

    declaration = algorithm_get(name)
    objective = objective_class(name)
    assert objective.name == declaration.name
    assert objective.shards() == declaration.learner_gang, f"{name}: learner_gang says otherwise than its objective"
    assert set(declaration.legacy_keys.values()) <= set(declaration.params.model_fields), name
    assert declaration.params() == declaration.params.model_validate({})  # every setting has a default


def test_a_declaration_without_an_objective_class_is_refused_by_name() -> None:
    from workers.algorithms.objectives import objective_class

    with pytest.raises(ValueError, match="unknown algorithm 'nope'; known: grpo, dpo, sft, mix"):
        objective_class("nope")
    assert algorithm_names() == [a.name for a in algorithms()]


# Configs as stored before trainer.params: every old field, defaults included.
OLD_TRAINER = {"learning_rate": 1e-5, "loss_type": "dapo", "beta": 0.0, "epsilon": 0.2, "epsilon_high": None,
               "max_grad_norm": 1.0, "mu": 0.1, "expert_share": 0.25, "dpo_beta": 0.1, "scale_rewards": "group",
               "lora": None, "precision": "fp32", "gradient_checkpointing": False, "processes": 1, "hosts": 1,
               "sharding": "full", "optimizer": "adamw"}


# trainer fields the config gained after apps/runs/migrations/0010_trainer_params.
ADDED_SINCE_THE_MIGRATION = {"collective_timeout_s"}


def _old(algorithm: str, **trainer: Any) -> dict[str, Any]:
    return {"model": "m", "algorithm": algorithm, "repeat_times": 4, "trainer": {**OLD_TRAINER, **trainer}}


@pytest.mark.parametrize("algorithm,changed,expected", [
    ("grpo", {"loss_type": "grpo", "beta": 0.04, "mu": 0.9}, GRPOParams(loss_type="grpo", beta=0.04)),
    ("dpo", {"dpo_beta": 0.3, "beta": 0.5}, DPOParams(beta=0.3)),
    ("mix", {"mu": 0.4, "expert_share": 0.5, "epsilon_high": 0.28}, MIXParams(mu=0.4, expert_share=0.5, epsilon_high=0.28)),
])
def test_an_old_flat_config_loads_with_its_algorithms_settings(algorithm: str, changed: dict[str, Any],
                                                               expected: object) -> None:
    cfg = config_validate(data=_old(algorithm, **changed, learning_rate=3e-6))
    assert cfg.trainer.params == expected and type(cfg.trainer.params) is type(expected)
    assert cfg.trainer.learning_rate == 3e-6
    # What the migration writes for a stored run is what the config now dumps, but for the
    # fields added since (their defaults fill in when the stored config is read).
    migrated = MIGRATION.trainer_forward(_old(algorithm, **changed, learning_rate=3e-6))["trainer"]
    dumped = config_dump(cfg)["trainer"]
    assert isinstance(dumped, dict)
    assert set(dumped) - set(migrated) == ADDED_SINCE_THE_MIGRATION
    assert migrated == {key: value for key, value in dumped.items() if key not in ADDED_SINCE_THE_MIGRATION}


def test_an_old_sft_config_keeps_none_of_the_other_algorithms_settings() -> None:
    cfg = config_validate(data=_old("sft", beta=0.3, loss_type="grpo"))
    assert config_dump(cfg)["trainer"]["params"] == {}  # type: ignore[call-overload, index]


@pytest.mark.django_db
def test_the_migration_moves_a_stored_runs_settings_and_back() -> None:
    from django.apps import apps as django_apps

    from apps.runs.models import Run
    from tests.factories import make_run

    run = make_run()
    Run.objects.filter(pk=run.pk).update(config=_old("mix", mu=0.4, loss_type="grpo"))
    MIGRATION.forward(django_apps, None)
    run.refresh_from_db()
    assert run.config["trainer"]["params"] == {"loss_type": "grpo", "beta": 0.0, "epsilon": 0.2, "epsilon_high": None,
                                               "scale_rewards": "group", "mu": 0.4, "expert_share": 0.25}
    assert not set(MIGRATION.OLD_KEYS) & set(run.config["trainer"])
    assert config_validate(data=run.config).trainer.params == MIXParams(loss_type="grpo", mu=0.4)
    MIGRATION.forward(django_apps, None)  # a second pass changes nothing
    run.refresh_from_db()
    assert run.config["trainer"]["params"]["mu"] == 0.4
    MIGRATION.backward(django_apps, None)
    run.refresh_from_db()
    assert run.config["trainer"] == {**OLD_TRAINER, "mu": 0.4, "loss_type": "grpo"}
