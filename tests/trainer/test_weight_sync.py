"""Weight sync: the checkpoint path on any host, the NCCL path where there are GPUs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from apps.runs.models import ModelVersion
from tests.factories import make_run
from workers.sync import CheckpointSync, NcclSync, SyncUnavailable, version_dir, weight_sync_for


@pytest.mark.django_db
def test_checkpoint_sync_writes_a_loadable_version_and_records_it(
    owner: Any, tiny_model_dir: Path, load_model: Any, tokenizer: Any, settings: Any, tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM

    settings.RFT_STORAGE_DIR = tmp_path
    run = make_run(owner=owner, model=str(tiny_model_dir))
    model = load_model()
    with torch.no_grad():
        model.lm_head.weight.mul_(2.0)
    published = weight_sync_for("checkpoint").publish(run=run, number=1, train_step=1, model=model, tokenizer=tokenizer)
    assert published.seconds > 0
    assert published.bytes == (version_dir(run.pk, 1) / "model.safetensors").stat().st_size
    assert published.bytes >= 4 * sum(p.numel() for p in model.parameters())
    version = ModelVersion.objects.get(run=run, number=1)
    assert Path(version.checkpoint) == version_dir(run.pk, 1) == tmp_path / "runs" / str(run.pk) / "v1"
    loaded = AutoModelForCausalLM.from_pretrained(version.checkpoint)
    torch.testing.assert_close(loaded.lm_head.weight, model.lm_head.weight)
    assert not list(version_dir(run.pk, 1).parent.glob(".v1.tmp-*")), "a temporary directory was left behind"
    run.refresh_from_db()
    assert run.current_version == 1


def test_an_unknown_sync_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown weight sync"):
        weight_sync_for("carrier-pigeon")
    assert isinstance(weight_sync_for("checkpoint"), CheckpointSync)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on hosts without CUDA")
def test_nccl_sync_refuses_a_host_without_cuda() -> None:
    with pytest.raises(SyncUnavailable, match="CUDA"):
        NcclSync()


# The NCCL path itself (two ranks on two GPUs) is in tests/gpu/test_cuda_paths.py, which runs
# on a GPU machine without the database.
