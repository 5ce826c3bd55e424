"""A run whose trainer config asks for two learner processes: the train task starts the
group itself (its own process as rank 0, one follower over gloo) and the version it
publishes after a step holds the same weights as a one-process run trained on the same
batch, for GRPO and SFT. Settings the group cannot split exactly are refused in the run
config, naming the field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from apps.buffer.services import experience_write
from apps.runs.config import ConfigInvalid, config_validate
from apps.runs.models import Metric, ModelVersion
from tests.factories import experience_row
from tests.trainer.conftest import running_run
from workers import trainer as trainer_mod

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture(autouse=True)
def _storage(settings: Any, tmp_path: Path) -> Any:
    settings.RFT_STORAGE_DIR = tmp_path / "storage"
    trainer_mod._RESIDENTS.clear()
    yield settings.RFT_STORAGE_DIR
    for run_id in list(trainer_mod._RESIDENTS):
        trainer_mod.resident_drop(run_id)


def _fill(run: Any, *, expert: bool) -> None:
    """Three groups of four (uneven over two processes), one prompt length (TRL's forward
    takes positions from 0 whatever the left padding), varied completions and rewards."""
    g = torch.Generator().manual_seed(5)
    rows = []
    for gi in range(3):
        prompt = torch.randint(10, 200, (4,), generator=g).tolist()
        for j in range(4):
            completion = torch.randint(10, 200, (2 + (j * 5 + gi) % 6,), generator=g).tolist()
            rows.append(experience_row(run, key=f"g{gi}-{j}", group=f"g{gi}", token_ids=prompt + completion,
                                       prompt_length=4, logprobs=[-0.7] * len(completion),
                                       reward=float((j * 7 + gi) % 3), is_expert=expert))
    experience_write(experiences=rows)


def _trained(owner: Any, model_dir: Path, *, algorithm: str, processes: int) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    run = running_run(owner, model_dir, algorithm=algorithm, train_batch_size=12, total_steps=5,
                      trainer={"learning_rate": 1e-2, "loss_type": "grpo" if algorithm == "grpo" else "dapo",
                               "processes": processes})
    _fill(run, expert=algorithm == "sft")
    out = trainer_mod.train_step.apply(args=(run.pk, 1)).get()
    assert out["status"] == "trained", out
    if processes > 1:
        res = trainer_mod._RESIDENTS[run.pk]
        assert res.group is not None and len(res.group.followers) == processes - 1
        assert all(p.poll() is None for p in res.group.followers), "a follower process ended"
        assert Metric.objects.get(run=run, step=1, name="learner_processes").value == processes
    version = ModelVersion.objects.get(run=run, number=1)
    return load_file(str(Path(version.checkpoint) / "model.safetensors"))


@pytest.mark.parametrize("algorithm", ["grpo", "sft"])
def test_two_learner_processes_started_by_the_train_task_publish_the_one_process_weights(
    owner: Any, tiny_model_dir: Path, algorithm: str
) -> None:
    from safetensors.torch import load_file

    torch.set_num_threads(1)
    one = _trained(owner, tiny_model_dir, algorithm=algorithm, processes=1)
    two = _trained(owner, tiny_model_dir, algorithm=algorithm, processes=2)
    before = load_file(str(tiny_model_dir / "model.safetensors"))
    assert one.keys() == two.keys()
    assert any(not torch.equal(before[k], one[k]) for k in one), "the step changed nothing"
    for name in one:
        # Two partial gradient sums then the all-reduce: float noise only (Adam's first
        # step moves a weight by up to lr on a near-zero gradient, hence this bound).
        torch.testing.assert_close(two[name], one[name], atol=1e-4, rtol=1e-3)
    # The followers end with their resident (and with this process, were it killed).
    followers = [p for res in trainer_mod._RESIDENTS.values() if res.group for p in res.group.followers]
    for run_id in list(trainer_mod._RESIDENTS):
        trainer_mod.resident_drop(run_id)
    assert followers and all(p.poll() is not None for p in followers)


def test_a_celery_train_worker_runs_a_two_process_run_to_the_one_process_weights(
    owner: Any, tiny_model_dir: Path, celery_workers: Any
) -> None:
    """The same through a real train worker (a prefork child starts the follower) and the
    conductor, from `start` to a finished run."""
    from safetensors.torch import load_file

    from apps.runs.models import Run
    from apps.runs.services import run_transition
    from tests.factories import make_run, make_taskset
    from tests.trainer.test_modes import drive

    torch.set_num_threads(1)
    one = _trained(owner, tiny_model_dir, algorithm="grpo", processes=1)
    run = make_run(owner=owner, taskset=make_taskset(owner=owner), model=str(tiny_model_dir), mode="train",
                   train_batch_size=12, repeat_times=4, explore_batch_size=2, total_steps=1,
                   trainer={"learning_rate": 1e-2, "loss_type": "grpo", "processes": 2})
    _fill(run, expert=False)
    run_transition(run=run, action="start", actor=owner)
    run = drive(run, lambda r: r.status == Run.Status.FINISHED, explorer=None, timeout=600)
    assert Metric.objects.get(run=run, step=1, name="learner_processes").value == 2
    two = load_file(str(Path(ModelVersion.objects.get(run=run, number=1).checkpoint) / "model.safetensors"))
    for name in one:
        torch.testing.assert_close(two[name], one[name], atol=1e-4, rtol=1e-3)


@pytest.mark.parametrize(("config", "message"), [
    ({"algorithm": "dpo", "trainer": {"processes": 2}}, "processes: a learner group trains grpo and sft"),
    ({"trainer": {"processes": 2, "loss_type": "cispo"}}, "processes: loss_type cispo does not split exactly"),
    ({"trainer": {"processes": 2, "scale_rewards": "batch"}}, "processes: scale_rewards=batch"),
])
def test_a_learner_group_that_would_train_another_objective_is_refused_in_the_config(
    config: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigInvalid) as refused:
        config_validate(data={"model": "m", **config})
    assert refused.value.errors["trainer"].startswith(message)
    assert config_validate(data={"model": "m", "algorithm": "sft", "trainer": {"processes": 2, "loss_type": "cispo"}})
