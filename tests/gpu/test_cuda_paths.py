"""The CUDA paths of the trainer and weight sync: bf16 / fp16 learner steps, gradient
checkpointing's memory on the GPU allocator, a LoRA step on a bf16 base, AdamW with 8-bit
state (bitsandbytes), the NCCL weight sync and the NCCL learner gang.

Self-contained (no database, no Django app, no conftest fixtures), so it also runs on a GPU
machine that holds only torch, transformers, peft, TRL and pydantic:

    python -m pytest --noconftest -p no:django -m gpu tests/gpu

Everything here carries the `gpu` marker and is skipped where CUDA is absent."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

from kernel.config import AdapterConfig
# bench.common, not tests.servers: that one imports psycopg, which a GPU machine lacks.
from bench.common import free_port

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

LORA = AdapterConfig(rank=8, alpha=16.0, dropout=0.0, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "up_proj"])


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from workers.models.tiny import tiny_model_save

    return tiny_model_save(tmp_path_factory.mktemp("cuda-model"), hidden_size=128, layers=4, heads=4, seed=0)


def _rollouts(seed: int = 3, *, groups: int = 3, size: int = 4, prompt: int = 8) -> list[Any]:
    from workers.algorithms import Rollout

    g = torch.Generator().manual_seed(seed)
    rows = []
    for gi in range(groups):
        p = torch.randint(10, 250, (prompt,), generator=g).tolist()
        for j in range(size):
            c = torch.randint(10, 250, (4 + (j * 5 + gi) % 12,), generator=g).tolist()
            # Stored logprobs near the model's own (a ~300-token vocabulary): the ratio, and so
            # the loss, depend on the weights (without them TRL's ratio is 1 whatever they are).
            rows.append(Rollout(id=gi * size + j, group_id=f"g{gi}", prompt_ids=p, completion_ids=c,
                                logprobs=[-5.6] * len(c), reward=float((j * 7 + gi) % 3)))
    return rows


def _learner(model_dir: Path, *, precision: str = "fp32", lora: bool = False, checkpointing: bool = False,
             optimizer: str = "adamw", algorithm: str = "grpo") -> Any:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from workers.weights.adapters import adapter_wrap
    from workers.algorithms import Learner, LearnerSpec
    from workers.algorithms import trl_bridge as bridge
    from workers.precision import precision_dtype

    torch.manual_seed(0)
    dtype = precision_dtype(precision) if lora else torch.float32
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to("cuda")
    if lora:
        model = adapter_wrap(model=model, lora=LORA)
    spec = LearnerSpec(algorithm=algorithm, params=bridge.TrainParams(learning_rate=1e-3), precision=precision,
                       gradient_checkpointing=checkpointing, lora=LORA if lora else None, optimizer=optimizer,
                       algorithm_params={"loss_type": "grpo"} if algorithm in ("grpo", "mix") else None)
    return Learner(spec=spec, model=model, tokenizer=AutoTokenizer.from_pretrained(model_dir))


def _first_loss(learner: Any) -> float:
    from workers.algorithms import TrainBatch
    from workers.precision import autocast

    with torch.no_grad(), autocast(learner.spec.precision, device="cuda"):
        loss, _ = learner.loss(TrainBatch(usual=_rollouts()))
    return float(loss)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_a_mixed_precision_step_on_cuda_keeps_fp32_weights_and_the_fp32_loss(model_dir: Path, precision: str) -> None:
    from workers.algorithms import TrainBatch
    from workers.precision import precision_check

    precision_check(precision, device="cuda")  # an H100 has both
    reference = _first_loss(_learner(model_dir))
    learner = _learner(model_dir, precision=precision)
    assert _first_loss(learner) == pytest.approx(reference, rel=0.05, abs=0.02)
    before = {n: p.detach().clone() for n, p in learner.model.named_parameters()}
    metrics = learner.step(TrainBatch(usual=_rollouts()))
    assert torch.isfinite(torch.tensor(metrics["loss"])) and metrics["grad_norm"] > 0
    moved = [n for n, p in learner.model.named_parameters() if not torch.equal(before[n], p.detach())]
    assert moved, "the step changed no weight"
    assert all(p.dtype == torch.float32 for p in learner.model.parameters()), "weights left float32"
    if precision == "fp16":
        assert learner.scaler is not None and learner.scaler.get_scale() > 0


def test_gradient_checkpointing_on_cuda_gives_the_same_loss_with_a_lower_allocator_peak(model_dir: Path) -> None:
    from workers.algorithms import TrainBatch

    peaks, losses = {}, {}
    rows = _rollouts(groups=4, size=8, prompt=64)
    for ckpt in (False, True):
        learner = _learner(model_dir, checkpointing=ckpt)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        floor = torch.cuda.memory_allocated()
        loss, _ = learner.loss(TrainBatch(usual=rows))
        loss.backward()
        torch.cuda.synchronize()
        peaks[ckpt] = torch.cuda.max_memory_allocated() - floor
        losses[ckpt] = float(loss.detach())
        del learner, loss
        torch.cuda.empty_cache()
    assert losses[True] == pytest.approx(losses[False], abs=1e-5)
    assert peaks[True] < 0.8 * peaks[False], peaks
    print(f"\nactivation peak on cuda: plain {peaks[False] / 2**20:.1f} MiB, checkpointing {peaks[True] / 2**20:.1f} MiB")


def test_a_lora_step_on_a_bf16_base_on_cuda_trains_the_adapter_only(model_dir: Path) -> None:
    from workers.algorithms import TrainBatch

    learner = _learner(model_dir, precision="bf16", lora=True)
    before = {n: p.detach().clone() for n, p in learner.model.named_parameters()}
    learner.step(TrainBatch(usual=_rollouts()))
    moved = {n for n, p in learner.model.named_parameters() if not torch.equal(before[n], p.detach())}
    assert moved and all("lora_" in n for n in moved)
    assert all(p.dtype == torch.bfloat16 for n, p in learner.model.named_parameters() if "lora_" not in n)


def test_adamw_8bit_on_cuda_keeps_8_bit_optimizer_state_and_trains(model_dir: Path) -> None:
    pytest.importorskip("bitsandbytes", reason="adamw_8bit needs bitsandbytes on this host")
    from workers.algorithms import TrainBatch

    learner = _learner(model_dir, optimizer="adamw_8bit")
    # transformers' adamw_bnb_8bit: bitsandbytes' AdamW with optim_bits=8.
    assert type(learner.optimizer).__module__.startswith("bitsandbytes"), type(learner.optimizer)
    before = {n: p.detach().clone() for n, p in learner.model.named_parameters()}
    first = _first_loss(learner)
    for _ in range(3):
        learner.step(TrainBatch(usual=_rollouts()))
    moved = [n for n, p in learner.model.named_parameters() if not torch.equal(before[n], p.detach())]
    assert moved
    states = [s for s in learner.optimizer.state.values() if s]
    assert states and any(t.dtype == torch.uint8 for s in states for t in s.values() if torch.is_tensor(t)), \
        "no 8-bit optimizer state"
    assert _first_loss(learner) != first


def _nccl_rank(rank: int, addr: str, model_dir: str, out: str) -> None:
    from transformers import AutoModelForCausalLM

    from workers.weights.sync import NcclSync

    torch.cuda.set_device(rank)
    sync = NcclSync(addr=addr, world_size=2, rank=rank)
    model = AutoModelForCausalLM.from_pretrained(model_dir).cuda()
    if rank == 0:
        with torch.no_grad():
            model.lm_head.weight.add_(1.0)
        sent = sync.broadcast(model, run_id=1, version=1, path="/v1")
        torch.save({"w": model.lm_head.weight.detach().cpu(), "bytes": sent}, os.path.join(out, "rank0.pt"))
    else:
        got = sync.receive()
        torch.save({"w": got.tensors["lm_head.weight"], "bytes": got.bytes, "seconds": got.seconds},
                   os.path.join(out, "rank1.pt"))


def test_nccl_sync_moves_the_trainers_weights_to_an_explorer_rank(model_dir: Path, tmp_path: Path) -> None:
    import torch.multiprocessing as mp

    if torch.cuda.device_count() < 2:
        pytest.skip("NCCL between two ranks needs two CUDA devices (NCCL refuses two ranks on one: "
                    "'Duplicate GPU detected')")
    mp.start_processes(_nccl_rank, args=(f"tcp://127.0.0.1:{free_port()}", str(model_dir), str(tmp_path)),
                       nprocs=2, start_method="spawn")
    sent, got = torch.load(tmp_path / "rank0.pt"), torch.load(tmp_path / "rank1.pt")
    torch.testing.assert_close(sent["w"], got["w"])
    assert sent["bytes"] == got["bytes"] > 0 and got["seconds"] > 0


def _nccl_stalled_rank(rank: int, addr: str, out: str) -> None:
    """Rank 0 broadcasts a version that rank 1 never takes (an explorer process that hangs)."""
    import json
    import time

    from workers.weights.sync import NcclSync, SyncFailed

    torch.cuda.set_device(rank)
    sync = NcclSync(addr=addr, world_size=2, rank=rank)
    sync._group_get()
    done = os.path.join(out, "rank0.json")
    if rank == 0:
        started, result = time.monotonic(), {}
        try:
            sync.broadcast(torch.nn.Linear(256, 256).cuda(), run_id=5, version=2, path="/shared/v2", timeout=2.0)
        except SyncFailed as exc:
            result = {"stage": exc.stage, "where": exc.where, "message": str(exc), "broken": sync.broken}
        result["seconds"] = time.monotonic() - started
        with open(done, "w") as fh:
            json.dump(result, fh)
    else:
        deadline = time.monotonic() + 120
        while not os.path.exists(done) and time.monotonic() < deadline:
            time.sleep(0.05)
    os._exit(0)  # NCCL's pending work must not hold the process at exit


def test_an_nccl_broadcast_no_rank_takes_fails_within_the_runs_bound(tmp_path: Path) -> None:
    """Issue 66.3 on NCCL itself (tests/trainer/test_sync_bounds_gloo.py runs the same code over gloo)."""
    import json

    import torch.multiprocessing as mp

    if torch.cuda.device_count() < 2:
        pytest.skip("NCCL between two ranks needs two CUDA devices")
    addr = f"tcp://127.0.0.1:{free_port()}"
    mp.start_processes(_nccl_stalled_rank, args=(addr, str(tmp_path)), nprocs=2, start_method="spawn")
    got = json.loads((tmp_path / "rank0.json").read_text())
    assert got["stage"] == "broadcast" and got["broken"], got
    assert got["where"] == f"nccl group {addr} (rank 0 of 2)"
    assert 2.0 * 0.9 <= got["seconds"] < 30.0, got


def test_a_learner_gang_wider_than_the_hosts_gpus_is_refused_with_the_count(model_dir: Path) -> None:
    from workers.algorithms.gang import GangUnsupported, gang_backend

    n = torch.cuda.device_count()
    assert gang_backend(n) == ("cpu:gloo,cuda:nccl", "cuda:0")
    with pytest.raises(GangUnsupported, match=f"{n + 1} learner processes need {n + 1} GPUs .* it has {n}"):
        gang_backend(n + 1)


def test_nccl_learner_gang_of_two_makes_the_one_process_update(model_dir: Path, tmp_path: Path) -> None:
    """Two ranks over NCCL (cuda:0, cuda:1), FSDP2 `full`, against one process on the same batch."""
    if torch.cuda.device_count() < 2:
        pytest.skip("an NCCL learner gang of two needs two CUDA devices")
    single = _learner(model_dir, algorithm="grpo")
    from workers.algorithms import TrainBatch

    single.step(TrainBatch(usual=_rollouts()))
    expected = {n: p.detach().cpu() for n, p in single.model.named_parameters()}
    _gang_spawn(2, model_dir, tmp_path, precision="fp32")
    got = torch.load(tmp_path / "gang0.pt")
    for name, value in expected.items():
        torch.testing.assert_close(got["params"][name], value, atol=1e-4, rtol=1e-3)


@pytest.mark.parametrize("sharding", ["full", "grad_op"])
def test_fsdp2_in_bf16_over_nccl_trains_like_one_bf16_process(model_dir: Path, tmp_path: Path, sharding: str) -> None:
    """FSDP2's MixedPrecisionPolicy (bf16 compute, fp32 reduction and master weights) over
    NCCL, on every GPU of the host (one suffices): the loss is the one-process bf16 loss
    within bf16's precision, and the step moves the fp32 master weights."""
    from workers.algorithms import TrainBatch

    world = torch.cuda.device_count()
    single = _learner(model_dir, algorithm="grpo", precision="bf16")
    before = {n: p.detach().cpu().clone() for n, p in single.model.named_parameters()}
    loss = single.step(TrainBatch(usual=_rollouts()))["loss"]
    _gang_spawn(world, model_dir, tmp_path, precision="bf16", sharding=sharding)
    got = torch.load(tmp_path / "gang0.pt")
    assert got["loss"] == pytest.approx(loss, abs=2e-2)
    assert all(v.dtype == torch.float32 for v in got["params"].values()), "the master weights are fp32"
    assert any(not torch.equal(before[n], got["params"][n]) for n in before), "the step changed nothing"


def _gang_spawn(world: int, model_dir: Path, out: Path, *, precision: str, sharding: str = "full") -> None:
    import torch.multiprocessing as mp

    mp.start_processes(_gang_rank, args=(world, f"tcp://127.0.0.1:{free_port()}", str(model_dir), str(out), precision,
                                         sharding), nprocs=world, start_method="spawn")


def _gang_rank(rank: int, world: int, addr: str, model_dir: str, out: str, precision: str, sharding: str) -> None:
    import torch.distributed as dist

    from workers.algorithms import TrainBatch
    from workers.algorithms.sharding import learner_shard, whole_state

    torch.cuda.set_device(rank)
    dist.init_process_group("cpu:gloo,cuda:nccl", init_method=addr, world_size=world, rank=rank)
    try:
        learner = _learner(Path(model_dir), precision=precision)  # on cuda:rank, the current device
        shard = learner_shard(learner, rank=rank, world=world, sharding=sharding)
        metrics = learner.step(TrainBatch(usual=_rollouts()), shard=shard)
        params = whole_state(learner)
        if rank == 0:
            torch.save({"params": params, "loss": metrics["loss"]}, os.path.join(out, "gang0.pt"))
    finally:
        dist.destroy_process_group()
