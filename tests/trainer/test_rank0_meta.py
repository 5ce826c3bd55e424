"""Rank 0 of a learner gang never holds the whole model (issue 66.5): on each path a train
worker starts its learner from, rank 0 builds the policy on the meta device and gives it
storage for its shards only (workers/algorithms/sharding.py): a new run, a learner gang's
snapshot, a published version of full weights and an adapter folder (the last two after lost
trainer state). A one-process snapshot is not a learner gang's start (a gang snapshots
sharded), and still loads whole.

Cheap: the resident's start is followed up to the learner gang (its start is stopped
there, no follower process), and the build rank 0 would run is run in a one-process gloo
gang on the tiny model, watching that every parameter is on meta before the shard load."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from apps.runs.models import Run
from apps.runs.ports import model_version_publish, run_view_of
from tests.factories import make_run
from tests.servers import free_port
from workers.trainer import resident as trainer_resident

pytestmark = pytest.mark.django_db


class _GangReached(Exception):
    """resident_for got as far as starting the learner gang."""


@pytest.fixture(autouse=True)
def _fresh(settings: Any, tmp_path: Path) -> Iterator[None]:
    settings.RFT_STORAGE_DIR = tmp_path / "storage"
    trainer_resident.RESIDENTS.clear()
    yield
    trainer_resident.RESIDENTS.clear()


def _gang_run(owner: Any, model_dir: Path, *, lora: bool = False, train_step: int = 0) -> Run:
    trainer: dict[str, Any] = {"learning_rate": 1e-3, "loss_type": "grpo", "processes": 2, "sharding": "full"}
    if lora:
        trainer["lora"] = {"rank": 4, "target_modules": ["q_proj", "v_proj"]}
    run = make_run(owner=owner, model=str(model_dir), mode="train", repeat_times=4, train_batch_size=8,
                   total_steps=10, trainer=trainer)
    Run.objects.filter(pk=run.pk).update(status=Run.Status.RUNNING, train_step=train_step)
    run.refresh_from_db()
    return run


def _rank0_start(run: Run, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """What rank 0 hands its learner gang: `learner` None and a `build` when it builds on
    its shards only; a whole load (policy_load) fails the test at once."""
    from workers.trainer import resident

    def whole(**_: Any) -> Any:
        raise AssertionError("rank 0 loaded the whole model")

    seen: dict[str, Any] = {}

    def gang_start(**kw: Any) -> Any:
        seen.update(kw)
        raise _GangReached

    monkeypatch.setattr(resident, "policy_load", whole)
    monkeypatch.setattr(resident, "gang_start", gang_start)
    with pytest.raises(_GangReached):
        resident.resident_for(run_view_of(run))
    assert seen["learner"] is None and seen["build"] is not None, seen
    return seen


def _built_on_meta(build: Any, monkeypatch: pytest.MonkeyPatch) -> dict[str, torch.Tensor]:
    """Run `build` as rank 0 does, in a gang of one: every parameter of what is sharded
    is on the meta device when the shard load starts, and the learner that comes out holds
    real storage."""
    import torch.distributed as dist

    from workers.algorithms import sharding
    from workers.algorithms.sharding import learner_sharded_build

    real = sharding._fully_shard
    devices: list[set[str]] = []

    def watched(model: torch.nn.Module, **kw: Any) -> None:
        devices.append({p.device.type for p in model.parameters()})
        real(model, **kw)

    monkeypatch.setattr(sharding, "_fully_shard", watched)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", world_size=1, rank=0)
    try:
        learner = learner_sharded_build(build, world=1, sharding="full")
        assert devices and all(d == {"meta"} for d in devices), devices
        assert all(p.device.type == "cpu" for p in learner.model.parameters())
        from torch.distributed.tensor import DTensor

        return {n: (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone()
                for n, p in learner.model.named_parameters()}
    finally:
        dist.destroy_process_group()


def test_a_new_run_builds_rank_0_on_the_meta_device(owner: Any, tiny_model_dir: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _rank0_start(_gang_run(owner, tiny_model_dir), monkeypatch)
    assert seen["checkpoint"] is None
    _built_on_meta(seen["build"], monkeypatch)


def test_resuming_from_a_learner_gangs_snapshot_builds_rank_0_on_the_meta_device(
    owner: Any, tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from workers.trainer import resident

    snapshot = tmp_path / "snapshot"
    (snapshot / "dcp").mkdir(parents=True)
    (snapshot / "dcp" / ".metadata").write_bytes(b"")  # a sharded snapshot (read after the build)
    monkeypatch.setattr(resident, "restore_point", lambda run_id, step: (snapshot, []))
    seen = _rank0_start(_gang_run(owner, tiny_model_dir, train_step=3), monkeypatch)
    assert seen["checkpoint"] == snapshot / "dcp"
    _built_on_meta(seen["build"], monkeypatch)


def test_resuming_from_a_published_version_builds_rank_0_on_the_meta_device_with_the_versions_weights(
    owner: Any, tiny_model_dir: Path, load_model: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from workers.trainer import resident

    run = _gang_run(owner, tiny_model_dir, train_step=3)
    trained = load_model()
    with torch.no_grad():
        trained.lm_head.weight.mul_(2.0)  # the version is not the run's model
    version = shutil.copytree(tiny_model_dir, tmp_path / "v3")
    trained.save_pretrained(version, safe_serialization=True)
    model_version_publish(run=run_view_of(run), number=3, checkpoint=str(version), train_step=3)
    monkeypatch.setattr(resident, "restore_point", lambda run_id, step: None)  # the trainer state is lost
    seen = _rank0_start(run, monkeypatch)
    assert seen["build"].source == str(version)
    weights = _built_on_meta(seen["build"], monkeypatch)
    for name, tensor in trained.state_dict().items():
        if name in weights:
            torch.testing.assert_close(weights[name], tensor, msg=name)


def test_resuming_from_an_adapter_folder_builds_rank_0_on_the_meta_device_with_the_adapters_weights(
    owner: Any, tiny_model_dir: Path, load_model: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from safetensors.torch import load_file

    from kernel.config import AdapterConfig
    from workers.weights.adapters import ADAPTER_WEIGHTS, adapter_save, adapter_wrap
    from workers.trainer import resident

    run = _gang_run(owner, tiny_model_dir, lora=True, train_step=3)
    trained = adapter_wrap(model=load_model(), lora=AdapterConfig(rank=4, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():  # a trained adapter: lora_B is no longer zero
        for name, p in trained.named_parameters():
            if "lora_" in name:
                p.add_(torch.randn_like(p))
    folder = adapter_save(model=trained, out=tmp_path / "v3")
    model_version_publish(run=run_view_of(run), number=3, checkpoint=str(folder), train_step=3)
    monkeypatch.setattr(resident, "restore_point", lambda run_id, step: None)
    seen = _rank0_start(run, monkeypatch)
    assert seen["build"].source == str(folder)
    weights = _built_on_meta(seen["build"], monkeypatch)
    saved = load_file(str(folder / ADAPTER_WEIGHTS))
    live = {n.replace(".default.", "."): t for n, t in weights.items() if "lora_" in n}
    assert live.keys() == saved.keys() and saved
    for key, value in saved.items():
        torch.testing.assert_close(live[key], value, msg=key)
