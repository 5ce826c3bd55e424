"""Each algorithm has its own settings now, `trainer.params` (kernel/algorithms/<name>.py):
a stored run's flat `trainer.loss_type`, `beta`, `epsilon`, `epsilon_high`, `scale_rewards`,
`mu`, `expert_share` and `dpo_beta` move into `trainer.params` where they are its algorithm's
(DPO's `dpo_beta` becomes its `beta`), and are dropped where they are not (every stored
config held all of them, defaults included; the algorithm never read the others).

The mapping is written out here, as it was when the shape changed (a migration must not
follow later code); the config validator does the same for old config files
(kernel.algorithms.trainer_legacy_upgrade)."""

from collections.abc import Callable

from django.apps.registry import Apps
from django.db import migrations

OLD_KEYS = ("loss_type", "beta", "epsilon", "epsilon_high", "scale_rewards", "mu", "expert_share", "dpo_beta")
# The old schema's defaults, for the way back.
OLD_DEFAULTS = {"loss_type": "dapo", "beta": 0.0, "epsilon": 0.2, "epsilon_high": None, "scale_rewards": "group",
                "mu": 0.1, "expert_share": 0.25, "dpo_beta": 0.1}
_GRPO = {key: key for key in ("loss_type", "beta", "epsilon", "epsilon_high", "scale_rewards")}
# Per algorithm: old flat key -> its field in trainer.params.
RENAMES = {"grpo": _GRPO, "mix": {**_GRPO, "mu": "mu", "expert_share": "expert_share"}, "dpo": {"dpo_beta": "beta"},
           "sft": {}}


def trainer_forward(config: dict) -> dict:  # type: ignore[type-arg]
    trainer = dict(config.get("trainer") or {})
    if "params" in trainer:
        return config
    renames = RENAMES.get(str(config.get("algorithm", "grpo")), {})
    trainer["params"] = {renames[key]: trainer[key] for key in OLD_KEYS if key in trainer and key in renames}
    for key in OLD_KEYS:
        trainer.pop(key, None)
    return {**config, "trainer": trainer}


def trainer_backward(config: dict) -> dict:  # type: ignore[type-arg]
    trainer = dict(config.get("trainer") or {})
    if "params" not in trainer:
        return config
    params = trainer.pop("params") or {}
    back = {field: key for key, field in RENAMES.get(str(config.get("algorithm", "grpo")), {}).items()}
    flat = dict(OLD_DEFAULTS)
    flat.update({back[field]: value for field, value in params.items() if field in back})
    return {**config, "trainer": {**trainer, **flat}}


def _each_run(apps: Apps, change: Callable[[dict[str, object]], dict[str, object]]) -> None:
    Run = apps.get_model("runs", "Run")
    for run in Run.objects.only("id", "config").iterator():
        if isinstance(run.config, dict):
            config = change(run.config)
            if config is not run.config:
                Run.objects.filter(pk=run.pk).update(config=config)


def forward(apps, schema_editor):  # type: ignore[no-untyped-def]
    _each_run(apps, trainer_forward)


def backward(apps, schema_editor):  # type: ignore[no-untyped-def]
    _each_run(apps, trainer_backward)


class Migration(migrations.Migration):

    dependencies = [("runs", "0009_eval_positive_share")]

    operations = [migrations.RunPython(forward, backward)]
