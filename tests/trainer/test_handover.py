"""Where the explorer and the trainer share a process (bench/learning, the embedded default),
a published version reaches the explorer's engine from memory, and its durable checkpoint
is still written, off the critical path (workers/weights/handover.py). Real Postgres, this process,
the transformers engine on a tiny model."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from apps.buffer.services import task_attempts_create
from apps.runs.models import ModelVersion
from tests.trainer.conftest import running_run
from workers.trainer import resident as trainer_resident
from workers.engines import engine_cache_clear, engine_for
from workers.engines.hf_engine import HFEngine
from workers.engines.hf_engine import HFEngine
from workers.explore.explorer import VersionNotReady, explore, model_version_path
from workers.weights.handover import handover_clear, pending_wait
from workers.trainer.step import trainer_step
from apps.runs.ports import run_view_of

pytestmark = [pytest.mark.django_db, pytest.mark.slow]


@pytest.fixture(autouse=True)
def _fresh(settings: Any, tmp_path: Path) -> Any:
    settings.RFT_STORAGE_DIR = tmp_path / "storage"
    trainer_resident.RESIDENTS.clear()
    engine_cache_clear()
    handover_clear()
    yield
    handover_clear()
    engine_cache_clear()
    trainer_resident.RESIDENTS.clear()


@pytest.fixture
def file_loads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every checkpoint the transformers engine reads from disk (the real load still runs)."""
    loads: list[str] = []
    real = HFEngine.load

    def counting(self: HFEngine, *, version: int, path: str) -> None:
        loads.append(path)
        real(self, version=version, path=path)

    monkeypatch.setattr(HFEngine, "load", counting)
    return loads


def _run(owner: Any, model_dir: Path) -> Any:
    # Length-penalised rewards differ within a group, so every step moves the weights.
    run = running_run(owner, model_dir, mode="sync", engine="transformers", sync_interval=1, sync_offset=0,
                      explore_batch_size=2, repeat_times=4, train_batch_size=8, total_steps=4, epochs=4,
                      sampling={"temperature": 1.0, "max_tokens": 8},
                      rewards=[{"name": "length_penalty", "params": {"max_chars": 4}}])
    for epoch in range(4):
        task_attempts_create(run=run, epoch=epoch)
    return run


def _weights(model: Any) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_the_explorer_in_the_trainer_s_process_samples_the_new_version_without_reading_its_files(
    owner: Any, tiny_model_dir: Path, file_loads: list[str]
) -> None:
    from transformers import AutoModelForCausalLM

    run = _run(owner, tiny_model_dir)
    base = None
    for step in (1, 2, 3):
        assert explore(run_id=run.pk, step=step, worker="one-process")["tasks"] == 2
        engine = engine_for(run.cfg)
        assert isinstance(engine, HFEngine)
        if base is None:
            base = _weights(engine.model)
        assert trainer_step(run_id=run.pk, step=step, worker="one-process")["status"] == "trained"
    assert explore(run_id=run.pk, step=4, worker="one-process")["model_version"] == 3

    # Only the base model came from disk; versions 1-3 came from the trainer's memory.
    assert file_loads == [str(tiny_model_dir)]
    engine = engine_for(run.cfg)
    assert isinstance(engine, HFEngine)
    trained = _weights(trainer_resident.RESIDENTS[run.pk].model)
    assert engine.version == 3 and _same(_weights(engine.model), trained)
    assert base is not None and not _same(trained, base), "the steps should have moved the weights"

    # The durable checkpoint of each version is there all the same, with the same weights.
    pending_wait()
    v3 = ModelVersion.objects.get(run=run, number=3)
    on_disk = AutoModelForCausalLM.from_pretrained(v3.checkpoint, dtype=torch.float32)
    assert _same(_weights(on_disk), trained)
    assert (Path(v3.checkpoint) / "tokenizer_config.json").exists()
    assert all(Path(v.checkpoint).is_dir() for v in ModelVersion.objects.filter(run=run))


def test_a_version_recorded_before_its_files_waits_for_them_and_a_restarted_trainer_rewrites_them(
    owner: Any, tiny_model_dir: Path
) -> None:
    from transformers import AutoModelForCausalLM

    run = _run(owner, tiny_model_dir)
    explore(run_id=run.pk, step=1, worker="one-process")
    trainer_step(run_id=run.pk, step=1, worker="one-process")
    pending_wait()
    trained = _weights(trainer_resident.RESIDENTS[run.pk].model)
    checkpoint = Path(ModelVersion.objects.get(run=run, number=1).checkpoint)

    # A crash between the record and the background write: no files, nothing in memory.
    handover_clear()
    shutil.rmtree(checkpoint)
    run.refresh_from_db()
    with pytest.raises(VersionNotReady, match="not written yet"):
        model_version_path(run=run_view_of(run), version=1)

    # The restarted trainer rebuilds step 1 from its journal and writes version 1 again.
    trainer_resident.RESIDENTS.clear()
    trainer_resident.resident_for(run_view_of(run))
    assert model_version_path(run=run_view_of(run), version=1) == str(checkpoint)
    assert _same(_weights(AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)), trained)
