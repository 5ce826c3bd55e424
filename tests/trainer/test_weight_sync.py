"""Weight sync: the checkpoint path on any host, the NCCL path where there are GPUs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from apps.runs.models import ModelVersion
from tests.factories import make_run
from workers.weights.sync import CheckpointSync, NcclSync, SyncUnavailable, version_dir, weight_sync_for
from apps.runs.ports import run_view_of


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
    published = weight_sync_for("checkpoint").publish(run=run_view_of(run), number=1, train_step=1, model=model, tokenizer=tokenizer)
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


@pytest.mark.django_db
def test_a_later_version_is_written_like_the_one_before_byte_for_byte_and_loads_its_own_weights(
    owner: Any, tiny_model_dir: Path, load_model: Any, tokenizer: Any, settings: Any, tmp_path: Path
) -> None:
    """Version n is written from version n-1's layout (workers.weights.sync.weights_like), not by
    save_pretrained; the files are the ones save_pretrained writes, to the byte."""
    import filecmp

    from transformers import AutoModelForCausalLM

    from workers.weights.sync import save_pretrained_atomic

    settings.RFT_STORAGE_DIR = tmp_path
    run = make_run(owner=owner, model=str(tiny_model_dir))
    model = load_model()
    sync = weight_sync_for("checkpoint")
    sync.publish(run=run_view_of(run), number=1, train_step=1, model=model, tokenizer=tokenizer)
    with torch.no_grad():
        model.lm_head.weight.mul_(2.0)
    calls: list[Any] = []
    real = type(model).save_pretrained

    def counting(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        return real(self, *args, **kwargs)

    type(model).save_pretrained = counting  # type: ignore[method-assign]
    try:
        sync.publish(run=run_view_of(run), number=2, train_step=2, model=model, tokenizer=tokenizer)
    finally:
        type(model).save_pretrained = real  # type: ignore[method-assign]
    assert calls == [], "version 2 went through save_pretrained"
    reference = save_pretrained_atomic(model=model, tokenizer=tokenizer, out=tmp_path / "reference")
    v2 = version_dir(run.pk, 2)
    assert sorted(p.name for p in v2.iterdir()) == sorted(p.name for p in reference.iterdir())
    for p in reference.iterdir():
        assert filecmp.cmp(p, v2 / p.name, shallow=False), f"{p.name} differs from save_pretrained's"
    loaded = AutoModelForCausalLM.from_pretrained(v2)
    torch.testing.assert_close(loaded.lm_head.weight, model.lm_head.weight)


def test_a_directory_of_another_layout_is_not_copied(
    tiny_model_dir: Path, load_model: Any, tokenizer: Any, tmp_path: Path
) -> None:
    """A `like` whose tensors do not match (another shape, sharded, gone) gets save_pretrained."""
    from transformers import AutoModelForCausalLM

    from workers.weights.sync import save_pretrained_atomic, weights_like

    model = load_model()
    like = save_pretrained_atomic(model=model, tokenizer=tokenizer, out=tmp_path / "v1")
    state = dict(model.state_dict())
    state["lm_head.weight"] = state["lm_head.weight"][:-1]
    assert not weights_like(state=state, like=like, out=tmp_path / "other-shape")
    assert not weights_like(state=model.state_dict(), like=tmp_path / "missing", out=tmp_path / "gone")
    (like / "model.safetensors.index.json").write_text("{}")
    assert not weights_like(state=model.state_dict(), like=like, out=tmp_path / "sharded")
    out = save_pretrained_atomic(model=model, tokenizer=tokenizer, out=tmp_path / "v2", like=like)
    assert not (out / "model.safetensors.index.json").exists(), "copied the other layout's files"
    torch.testing.assert_close(AutoModelForCausalLM.from_pretrained(out).lm_head.weight, model.lm_head.weight)


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


@pytest.mark.django_db
def test_publishing_a_version_is_one_statement_idempotent_and_never_moves_the_run_back(run: Any) -> None:
    """A trainer publishes every step: the version row and the run's current version in one
    round trip; a re-publish keeps the first row, an older number leaves the run where it is."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from apps.runs.services import model_version_publish

    with CaptureQueriesContext(connection) as queries:
        v2 = model_version_publish(run=run, number=2, checkpoint="/ckpt/v2", train_step=2)
    assert len(queries) == 1, [q["sql"] for q in queries]
    assert run.current_version == 2
    assert v2.pk == ModelVersion.objects.get(run=run, number=2).pk and v2.checkpoint == "/ckpt/v2"
    again = model_version_publish(run=run, number=2, checkpoint="/elsewhere", train_step=9)
    assert (again.pk, again.checkpoint, again.train_step) == (v2.pk, "/ckpt/v2", 2)
    model_version_publish(run=run, number=1, checkpoint="/ckpt/v1", train_step=1)
    assert run.current_version == 2
    run.refresh_from_db()
    assert run.current_version == 2
    assert list(ModelVersion.objects.filter(run=run).values_list("number", "checkpoint")) == [(1, "/ckpt/v1"), (2, "/ckpt/v2")]
