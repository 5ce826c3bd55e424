"""An algorithm with a loss of its own is one file and one registration line.

The persona is a researcher adding reward-weighted likelihood (RWL: each completion token's
log-likelihood weighted by its reward minus a baseline, a loss no TRL trainer has) to
rftweb. tests/trainer/plugin_rwl.py is all of it: its settings, its objective and its
declaration, registered by its last line when imported. Loaded as RFT_PLUGINS loads it at a
process's start, the config validates its settings as `trainer.params`, the run form offers
it, the conductor claims what it declares, a learner trains a step with its loss, and a real
learner gang of two ranks (its follower a process of its own that imports the plugin because
rank 0 loaded it) makes the same step."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, cast

import pytest

from kernel import plugins
from kernel.algorithms import algorithm_unregister
from kernel.plugins import plugins_load
from workers.algorithms import NothingToTrain, Rollout, TrainBatch

if TYPE_CHECKING:
    from tests.trainer.plugin_rwl import RWLObjective
    from workers.algorithms import Learner

PLUGIN = "tests.trainer.plugin_rwl"


@pytest.fixture
def rwl(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """The plugin module loaded as a process loads RFT_PLUGINS=tests.trainer.plugin_rwl at
    its start; unloaded after (another test sees the built-in algorithms only)."""
    monkeypatch.setattr(plugins, "LOADED", [])
    plugins_load([PLUGIN])
    yield sys.modules[PLUGIN]
    _unload()


def _unload() -> None:
    algorithm_unregister("rwl")
    sys.modules.pop(PLUGIN, None)


# ----------------------------------------------------------------------------- the tests


def test_an_unregistered_algorithm_is_refused_by_name() -> None:
    from kernel.config import ConfigInvalid, config_validate

    with pytest.raises(ConfigInvalid, match="registered algorithms: grpo, dpo, sft, mix"):
        config_validate(data={"model": "m", "algorithm": "rwl"})


def test_a_process_loads_the_plugin_modules_rft_plugins_names_at_start(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What every Django process runs at start (the runs app's ready): the modules named by
    RFT_PLUGINS are imported, so their algorithms validate; one that cannot be imported
    stops the start naming it."""
    from django.apps import apps

    from kernel.config import config_validate
    from kernel.plugins import PluginMissing

    monkeypatch.setattr(plugins, "LOADED", [])
    settings.RFT_PLUGINS = [PLUGIN]
    try:
        apps.get_app_config("runs").ready()
        assert config_validate(data={"model": "m", "algorithm": "rwl"}).algorithm == "rwl"
        assert plugins.plugins_loaded() == [PLUGIN]
    finally:
        _unload()
    settings.RFT_PLUGINS = ["tests.trainer.no_such_plugin"]
    with pytest.raises(PluginMissing, match="RFT_PLUGINS: the plugin module 'tests.trainer.no_such_plugin'"):
        apps.get_app_config("runs").ready()


def test_its_declaration_reaches_the_config_the_form_and_the_conductor(rwl: ModuleType) -> None:
    from apps.control.forms import algorithm_defaults, config_field_specs
    from apps.control.conductor import batch_plan
    from kernel.config import ConfigInvalid, config_dump, config_validate

    cfg = config_validate(data={"model": "m", "algorithm": "rwl", "repeat_times": 1, "train_batch_size": 6,
                                "trainer": {"params": {"baseline": 0.25}}})
    assert isinstance(cfg.trainer.params, rwl.RWLParams) and cfg.trainer.params.baseline == 0.25
    dumped: Any = config_dump(cfg)
    assert dumped["trainer"]["params"] == {"baseline": 0.25}
    assert config_validate(data=config_dump(cfg)) == cfg
    with pytest.raises(ConfigInvalid) as bad:
        config_validate(data={"model": "m", "algorithm": "rwl", "trainer": {"params": {"loss_type": "dapo"}}})
    assert bad.value.errors == {"trainer.params.loss_type": "unknown key 'loss_type'"}
    algorithm_field = next(f for f in config_field_specs() if f.path == "algorithm")
    assert algorithm_field.widget == "select" and "rwl" in algorithm_field.choices
    assert algorithm_defaults()["rwl"]["trainer.params"] == "baseline: 0.5"
    plan = batch_plan(cfg=cfg)
    assert (plan.usual, plan.expert, plan.whole_groups) == (6, 0, True)


def _rows(seed: int = 0) -> list[Rollout]:
    """Two groups of three with rewards 0, 0.5 and 1 (one row's first token masked), and
    uneven completion lengths: dealt over two ranks the parts differ in tokens."""
    import torch

    g = torch.Generator().manual_seed(seed)
    rows = []
    for gi in range(2):
        prompt = torch.randint(10, 200, (3,), generator=g).tolist()
        for j in range(3):
            completion = torch.randint(10, 200, (2 + 2 * j + gi,), generator=g).tolist()
            mask = [0 if (gi, j, k) == (1, 2, 0) else 1 for k in range(len(completion))]
            rows.append(Rollout(id=gi * 3 + j, group_id=f"g{gi}", prompt_ids=prompt, completion_ids=completion,
                                reward=0.5 * j, action_mask=mask))
    return rows


def _config(model_dir: Path, *, processes: int = 1) -> Any:
    from kernel.config import config_validate

    return config_validate(data={"model": str(model_dir), "algorithm": "rwl", "seed": 0,
                                 "trainer": {"learning_rate": 1e-2, "processes": processes,
                                             "params": {"baseline": 0.5}}})


def _learner(model_dir: Path) -> Learner:
    """One process's learner on the run's model, loaded whole."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from workers.algorithms import Learner, spec_from_config

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return Learner(spec=spec_from_config(_config(model_dir)), model=model,
                   tokenizer=AutoTokenizer.from_pretrained(model_dir))


def test_a_learner_trains_a_step_with_its_loss(rwl: ModuleType, tiny_model_dir: Path) -> None:
    import torch

    learner = _learner(tiny_model_dir)
    assert isinstance(learner.objective, rwl.RWLObjective)
    objective = cast("RWLObjective", learner.objective)
    rows = _rows()
    # Rows rewarded at the baseline weigh nothing: the loss is the other rows' alone.
    loss, metrics = learner.loss(TrainBatch(usual=rows))
    off_baseline, _ = objective.loss_on([r for r in rows if r.reward != 0.5])
    tokens = sum(r.action_count for r in rows)
    assert metrics["weighted_tokens"] == tokens
    torch.testing.assert_close(loss, off_baseline * sum(r.action_count for r in rows if r.reward != 0.5) / tokens)
    before = {n: p.detach().clone() for n, p in learner.model.named_parameters()}
    metrics = learner.step(TrainBatch(usual=rows))
    assert metrics["train/skipped_no_signal"] == 0.0 and metrics["grad_norm"] > 0
    assert any(not torch.equal(p.detach(), before[n]) for n, p in learner.model.named_parameters())
    # Its no-gradient check: every reward at the baseline leaves the weights as they were.
    flat = [Rollout(**{**r.__dict__, "reward": 0.5}) for r in rows]
    after = {n: p.detach().clone() for n, p in learner.model.named_parameters()}
    assert learner.step(TrainBatch(usual=flat))["train/skipped_no_signal"] == 1.0
    assert all(torch.equal(p.detach(), after[n]) for n, p in learner.model.named_parameters())
    with pytest.raises(NothingToTrain, match="no scored rollout"):
        learner.loss(TrainBatch(usual=[Rollout(**{**r.__dict__, "reward": None}) for r in rows]))


# Bounded, generous: the follower imports Django, torch and TRL on a loaded 2-core host.
GANG_TIMEOUT_S = 600.0


def test_a_learner_gang_of_two_processes_trains_it_sharded_to_the_one_process_step(
    rwl: ModuleType, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """A real learner gang, as a train worker starts one: this process is rank 0, its
    follower a process of its own (`python -m workers.trainer.follower rank …`) that
    was told nothing of the plugin but what rank 0's gang spec says (its environment has no
    RFT_PLUGINS); both build on their shards only, train one step with the plugin's sharded
    loss and write a version from their shards one tensor at a time (the train worker's way)
    and gathered whole: both are the one process's weights after the same step."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from kernel.config import config_dump
    from workers.algorithms import spec_from_config
    from workers.algorithms.gang import GangPlan, LearnerGang
    from workers.algorithms.sharding import LearnerBuild, model_skeleton
    from workers.trainer.journal import journal_encode, rng_state

    cfg = _config(tiny_model_dir, processes=2)
    spec = spec_from_config(cfg)
    torch.set_num_threads(1)
    batch = TrainBatch(usual=_rows())
    gang = LearnerGang(learner=None, run_config=config_dump(cfg), plan=GangPlan(world=2, sharding="full"),
                       timeout_s=GANG_TIMEOUT_S, whole=model_skeleton(cfg=cfg, spec=spec),
                       build=LearnerBuild(cfg=cfg, spec=spec, tokenizer=AutoTokenizer.from_pretrained(tiny_model_dir)))
    try:
        assert isinstance(gang.learner.objective, rwl.RWLObjective)
        metrics = gang.step(batch, entry=journal_encode(step=1, batch=batch, batch_ids=[r.id for r in batch.usual],
                                                        rng=rng_state()))
        # A version two ways: streamed from the shards to a file, and gathered whole.
        version = tmp_path / "v1"
        version.mkdir()
        written = gang.version_write(version)
        whole = {n: p.detach().clone() for n, p in gang.whole_model().named_parameters()}
    finally:
        gang.close()
    assert written == (version / "model.safetensors").stat().st_size
    streamed = dict(AutoModelForCausalLM.from_pretrained(version, dtype=torch.float32).named_parameters())
    assert metrics["learner_processes"] == 2.0
    assert all(p.returncode == 0 for p in gang.followers_started), "the follower did not end cleanly"
    learner = _learner(tiny_model_dir)
    before = {n: p.detach().clone() for n, p in learner.model.named_parameters()}
    one = learner.step(TrainBatch(usual=_rows()))
    assert metrics["loss"] == pytest.approx(one["loss"], abs=1e-5)
    for name, value in learner.model.named_parameters():
        torch.testing.assert_close(whole[name], value.detach(), atol=1e-4, rtol=1e-3, msg=lambda m: f"{name}: {m}")
        torch.testing.assert_close(streamed[name].detach(), whole[name], atol=0, rtol=0, msg=lambda m: f"{name}: {m}")
    assert any(not torch.equal(before[n], p.detach()) for n, p in learner.model.named_parameters()), \
        "the step changed nothing"
