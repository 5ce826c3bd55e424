"""Learning that reproduces for a seed: the same run config run twice in one process, one
after the other (so the process's RNG has moved on, and the database hands out other ids),
samples the same completions and ends on the same weights, bit for bit on CPU; another seed
does not. Real Postgres, the explorer and the trainer in this process (as bench/learning
runs them), the transformers engine on a tiny model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from apps.buffer.models import Experience
from apps.buffer.services import task_attempts_create
from tests.trainer.conftest import running_run
from workers.trainer import journal as trainer_journal, resident as trainer_resident
from workers.engines import engine_cache_clear
from workers.explore.explorer import explore
from workers.weights.handover import handover_clear, pending_wait
from workers.trainer.step import trainer_step

pytestmark = [pytest.mark.django_db, pytest.mark.slow]

STEPS = 3


def _fresh() -> None:
    pending_wait()
    handover_clear()
    engine_cache_clear()
    trainer_resident.RESIDENTS.clear()


@pytest.fixture(autouse=True)
def _storage(settings: Any, tmp_path: Path) -> Any:
    settings.RFT_STORAGE_DIR = tmp_path / "storage"
    _fresh()
    yield
    _fresh()


def _learn(owner: Any, model_dir: Path, *, seed: int) -> tuple[list[str], dict[str, torch.Tensor]]:
    """(every sampled response in write order, the trainer's weights after STEPS steps)."""
    run = running_run(owner, model_dir, mode="sync", engine="transformers", seed=seed, sync_interval=1,
                      sync_offset=0, explore_batch_size=2, repeat_times=4, train_batch_size=8, total_steps=STEPS,
                      epochs=STEPS, sampling={"temperature": 1.0, "max_tokens": 8},
                      rewards=[{"name": "length_penalty", "params": {"max_chars": 4}}])
    for epoch in range(STEPS):
        task_attempts_create(run=run, epoch=epoch)
    for step in range(1, STEPS + 1):
        assert explore(run_id=run.pk, step=step, worker="explorer")["experiences"] == 8
        assert trainer_step(run_id=run.pk, step=step, worker="trainer")["status"] == "trained"
    texts = list(Experience.objects.filter(run=run).order_by("id").values_list("response_text", flat=True))
    # The trainer frees the policy after the last step; its snapshot of that step holds the weights.
    from safetensors.torch import load_file

    weights = load_file(str(trainer_journal.state_dir(run.pk, STEPS) / "model.safetensors"))
    _fresh()
    return texts, weights


def test_a_run_repeated_with_its_seed_samples_and_learns_the_same_and_another_seed_does_not(
    owner: Any, tiny_model_dir: Path
) -> None:
    texts, weights = _learn(owner, tiny_model_dir, seed=7)
    # Whatever this process drew in between must not matter.
    torch.rand(1000)
    again_texts, again_weights = _learn(owner, tiny_model_dir, seed=7)
    other_texts, other_weights = _learn(owner, tiny_model_dir, seed=8)

    assert again_texts == texts
    assert weights.keys() == again_weights.keys()
    assert all(torch.equal(weights[k], again_weights[k]) for k in weights)
    assert other_texts != texts
    assert any(not torch.equal(weights[k], other_weights[k]) for k in weights)
