"""Issue 66.5 end to end: a run of two learner processes whose trainer state was lost resumes
from its newest published version (full weights, or a LoRA run's adapter folder) with rank 0 on its shards only, every rank
reading its rows of the version (LearnerBuild.source), and its next version holds the weights
a one-process trainer resuming from the same version makes. (It found a learner gang's
snapshot of a fresh optimizer giving it a zero step, so the gang's next step was Adam's
second: workers/algorithms/sharding.py `_dcp_state` now leaves a fresh one fresh.)"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from apps.buffer.services import experience_write
from apps.runs.models import ModelVersion, Run
from apps.runs.ports import model_version_publish, run_view_of
from tests.factories import experience_row
from tests.trainer.conftest import running_run
from workers.trainer import resident as trainer_resident, task as trainer_task

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture(autouse=True)
def _storage(settings: Any, tmp_path: Path) -> Any:
    settings.RFT_STORAGE_DIR = tmp_path / "storage"
    trainer_resident.RESIDENTS.clear()
    yield
    for run_id in list(trainer_resident.RESIDENTS):
        trainer_resident.resident_drop(run_id)


def _version(model_dir: Path, out: Path) -> Path:
    """A published version that is not the run's model: the tiny model, every weight moved."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    shutil.copytree(model_dir, out)
    model.save_pretrained(out, safe_serialization=True)
    return out


def _fill(run: Run) -> None:
    g = torch.Generator().manual_seed(5)
    rows = []
    for gi in range(3):
        prompt = torch.randint(10, 200, (4,), generator=g).tolist()
        for j in range(4):
            completion = torch.randint(10, 200, (2 + (j * 5 + gi) % 6,), generator=g).tolist()
            rows.append(experience_row(run, key=f"g{gi}-{j}", group=f"g{gi}", token_ids=prompt + completion,
                                       prompt_length=4, logprobs=[-0.7] * len(completion),
                                       reward=float((j * 7 + gi) % 3), model_version=1))
    experience_write(experiences=rows)


def _adapter_version(model_dir: Path, out: Path) -> Path:
    """A published LoRA version: an adapter folder of the run's adapter shape, trained (moved)."""
    from transformers import AutoModelForCausalLM

    from kernel.config import AdapterConfig
    from workers.weights.adapters import adapter_save, adapter_wrap

    model = adapter_wrap(model=AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32),
                         lora=AdapterConfig(**LORA))
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.add_(torch.randn(p.shape, generator=g) * 0.05)
    return adapter_save(model=model, out=out)


LORA: dict[str, Any] = {"rank": 4, "alpha": 16.0, "target_modules": ["q_proj", "v_proj"]}


def _resumed(owner: Any, model_dir: Path, version: Path, processes: int, lora: bool = False) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    from workers.weights.adapters import ADAPTER_WEIGHTS

    trainer = {"learning_rate": 1e-2, "loss_type": "grpo", "processes": processes, **({"lora": LORA} if lora else {})}
    run = running_run(owner, model_dir, train_batch_size=12, total_steps=5, trainer=trainer)
    Run.objects.filter(pk=run.pk).update(train_step=1)  # step 1 was trained; its state is gone
    run.refresh_from_db()
    model_version_publish(run=run_view_of(run), number=1, checkpoint=str(version), train_step=1)
    _fill(run)
    out = trainer_task.train_step.apply(args=(run.pk, 2)).get()
    assert out["status"] == "trained", out
    if processes > 1:
        gang = trainer_resident.RESIDENTS[run.pk].gang
        assert gang is not None and gang.rank0_sharded, "rank 0 loaded the whole version"
        for model in [m for m in (gang.learner.model, gang.learner.ref_model) if m is not None]:
            for name, p in model.named_parameters():
                assert p.to_local().shape[0] <= -(-p.shape[0] // gang.world), f"rank 0 holds all of {name}"
    return load_file(str(Path(ModelVersion.objects.get(run=run, number=2).checkpoint)
                         / (ADAPTER_WEIGHTS if lora else "model.safetensors")))


@pytest.mark.parametrize("lora", [False, True], ids=["full", "adapter"])
def test_two_ranks_resume_from_a_published_version_on_their_shards_to_the_one_process_weights(
    owner: Any, tiny_model_dir: Path, tmp_path: Path, lora: bool
) -> None:
    from safetensors.torch import load_file

    from workers.weights.adapters import ADAPTER_WEIGHTS

    torch.set_num_threads(1)
    version = (_adapter_version if lora else _version)(tiny_model_dir, tmp_path / "v1")
    one = _resumed(owner, tiny_model_dir, version, processes=1, lora=lora)
    two = _resumed(owner, tiny_model_dir, version, processes=2, lora=lora)
    start = load_file(str(version / (ADAPTER_WEIGHTS if lora else "model.safetensors")))
    assert one.keys() == two.keys()
    assert any(not torch.equal(start[k], one[k]) for k in one), "the step changed nothing"
    for name in one:
        torch.testing.assert_close(two[name], one[name], atol=1e-4, rtol=1e-3)
