"""A rank of a learner gang loads only its shard of the model (workers.algorithms.sharding
.model_sharded_load): built on the meta device, sharded, then its rows read from the
safetensors files. Two gloo ranks so loaded give the one-process model's logits, first
loss and next weights on the same batch, for a model with its own output head and one
whose head is its input embeddings (tied), with the reference model loaded the same way.
Under an address-space limit that a whole load fails, the ranks train, and so does a train
worker's rank 0 (tests/trainer/limited_rank0.py: the resident learner built on its shards)."""

from __future__ import annotations

import datetime
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import torch

from workers.algorithms import Learner, LearnerSpec, Rollout, TrainBatch
from workers.algorithms import trl_bridge as bridge

from tests.servers import free_port

if TYPE_CHECKING:
    from kernel.config import AdapterConfig

pytestmark = pytest.mark.slow

# Bounded, generous: two ranks import torch and TRL on a loaded 2-core host.
GANG_TIMEOUT_S = 900.0


def _batch() -> TrainBatch:
    g = torch.Generator().manual_seed(5)
    rows = []
    for gi in range(2):
        prompt = torch.randint(10, 200, (4,), generator=g).tolist()
        for j in range(3):
            completion = torch.randint(10, 200, (3 + j,), generator=g).tolist()
            rows.append(Rollout(id=gi * 3 + j, group_id=f"g{gi}", prompt_ids=prompt, completion_ids=completion,
                                logprobs=[-0.7] * len(completion), reward=float((j + gi) % 3)))
    return TrainBatch(usual=rows)


def _spec() -> LearnerSpec:
    # beta > 0: a reference model, loaded sharded too.
    return LearnerSpec(algorithm="grpo", params=bridge.TrainParams(learning_rate=1e-2),
                       algorithm_params={"loss_type": "grpo", "beta": 0.04})


def _ids() -> torch.Tensor:
    return torch.arange(10, 26).reshape(2, 8)


def _compared(rank: int, world: int, model_dirs: list[str], out: str) -> None:
    """In the gang: each model loaded sharded, its logits on `_ids`, one GRPO step; rank 0
    saves what the one process is compared with, every rank the rows it holds of each weight."""
    from torch.distributed.device_mesh import init_device_mesh
    from transformers import AutoTokenizer

    from workers.algorithms.sharding import learner_shard, model_sharded_load, whole_state

    mesh = init_device_mesh("cpu", (world,))
    for i, model_dir in enumerate(model_dirs):
        torch.manual_seed(0)
        model = model_sharded_load(model_dir, mesh=mesh, reshard=True, precision="fp32")
        ref = model_sharded_load(model_dir, mesh=mesh, reshard=True, precision="fp32")
        held = {n: (p.to_local().numel(), p.numel()) for n, p in model.named_parameters()}
        with torch.no_grad():
            logits = model(_ids()).logits
        learner = Learner(spec=_spec(), model=model, tokenizer=AutoTokenizer.from_pretrained(model_dir), ref_model=ref)
        shard = learner_shard(learner, rank=rank, world=world, sharding="full")
        metrics = learner.step(_batch(), shard=shard)
        whole = whole_state(learner)
        torch.save({"logits": logits, "loss": metrics["loss"], "whole": whole, "held": held},
                   Path(out) / f"model{i}-rank{rank}.pt")


def _spawn_bounded(fn: Any, world: int, *args: Any) -> None:
    """The ranks, waited on until they end (a rank that fails ends the others), at most
    GANG_TIMEOUT_S."""
    import torch.multiprocessing as mp

    ctx = mp.start_processes(fn, args=(world, f"tcp://127.0.0.1:{free_port()}", *args), nprocs=world,
                             start_method="spawn", join=False)
    deadline = time.monotonic() + GANG_TIMEOUT_S
    while not ctx.join(timeout=5):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail(f"the {world} ranks did not end within {GANG_TIMEOUT_S:.0f} s")


@pytest.fixture(scope="module")
def tied_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from workers.models.tiny import tiny_model_save

    return tiny_model_save(tmp_path_factory.mktemp("tied-model"), hidden_size=32, layers=2, heads=2, seed=1, tied=True)


def _one_process(model_dir: Path) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    ref = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.no_grad():
        logits = model(_ids()).logits
    learner = Learner(spec=_spec(), model=model, tokenizer=AutoTokenizer.from_pretrained(model_dir), ref_model=ref)
    metrics = learner.step(_batch())
    return {"logits": logits, "loss": metrics["loss"], "whole": dict(model.state_dict())}


@pytest.fixture(scope="module")
def gang_out(tiny_model_dir: Path, tied_model_dir: Path, large_model_dir: Path,
             tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What the module's one gang of two ranks wrote (`_rank`): the untied and the tied
    model compared, then the large model under the limit."""
    out = tmp_path_factory.mktemp("gang")
    weight_bytes = (large_model_dir / "model.safetensors").stat().st_size
    _spawn_bounded(_rank, 2, [str(tiny_model_dir), str(tied_model_dir)], str(tiny_model_dir), str(large_model_dir),
                   weight_bytes, str(out))
    return out


def test_two_ranks_that_load_only_their_shards_compute_the_one_process_logits_loss_and_update(
    tiny_model_dir: Path, tied_model_dir: Path, gang_out: Path
) -> None:
    dirs = [tiny_model_dir, tied_model_dir]
    for i, model_dir in enumerate(dirs):
        what = "tied" if i else "untied"
        one = _one_process(model_dir)
        got = torch.load(gang_out / f"model{i}-rank0.pt", weights_only=False)
        # The forward gathers the very weights one process holds: the same logits.
        torch.testing.assert_close(got["logits"], one["logits"], atol=1e-6, rtol=1e-5, msg=lambda m: f"{what}: {m}")
        assert got["loss"] == pytest.approx(one["loss"], abs=1e-5), what
        assert got["whole"].keys() == one["whole"].keys(), what
        for name, value in one["whole"].items():
            torch.testing.assert_close(got["whole"][name], value, atol=1e-4, rtol=1e-3, msg=lambda m: f"{what}: {name}: {m}")
        if i:
            assert torch.equal(got["whole"]["lm_head.weight"], got["whole"]["model.embed_tokens.weight"]), "still tied"
        for rank in (0, 1):
            held = torch.load(gang_out / f"model{i}-rank{rank}.pt", weights_only=False)["held"]
            for name, (local, total) in held.items():
                # Its rows only (FSDP2's dim-0 split): never a whole weight of more than one row.
                rows = one["whole"][name].shape[0]
                assert local <= -(-rows // 2) * (total // rows), f"{what}: rank {rank} holds all of {name}"


# ----------------------------------------------------------------------------- a model larger than a rank's memory

# The address space a rank may grow by once warmed up, as a share of the model's whole
# weights: a whole load does not fit (its weights, and transformers maps the file besides),
# a rank's half of the frozen base, an adapter, a gathered block and a LoRA step's
# activations do (~0.65 of the weights on this model).
LIMIT_SHARE = 0.85


def _vm_bytes() -> int:
    with open("/proc/self/status") as fh:
        return int(next(line for line in fh if line.startswith("VmSize:")).split()[1]) * 1024


def _lora_spec() -> tuple[LearnerSpec, AdapterConfig]:
    from kernel.config import AdapterConfig

    lora = AdapterConfig(rank=4, alpha=8.0, dropout=0.0, target_modules=["q_proj", "v_proj"])
    return LearnerSpec(algorithm="grpo", params=bridge.TrainParams(learning_rate=1e-2), lora=lora,
                       algorithm_params={"loss_type": "grpo"}), lora


def _lora_sharded(model_dir: str, *, rank: int, world: int) -> tuple[Learner, Any]:
    """A GRPO learner with a fresh adapter on the model at `model_dir`, loaded sharded over
    the gang (`model_sharded_load`)."""
    from torch.distributed.device_mesh import init_device_mesh
    from transformers import AutoTokenizer

    from workers.algorithms.sharding import learner_shard, model_sharded_load

    spec, lora = _lora_spec()
    torch.manual_seed(0)
    model = model_sharded_load(model_dir, mesh=init_device_mesh("cpu", (world,)), reshard=True, precision="fp32", lora=lora)
    learner = Learner(spec=spec, model=model, tokenizer=AutoTokenizer.from_pretrained(model_dir))
    return learner, learner_shard(learner, rank=rank, world=world, sharding="full")


def _lora_whole(model_dir: str) -> torch.nn.Module:
    """The model at `model_dir` loaded whole with a fresh adapter, as a rank did before it
    loaded only its shard (this process's part of it: no collective)."""
    from transformers import AutoModelForCausalLM

    from workers.weights.adapters import adapter_wrap

    _, lora = _lora_spec()
    return adapter_wrap(model=AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32), lora=lora)


def _rank(rank: int, world: int, addr: str, model_dirs: list[str], warm_dir: str, model_dir: str, weight_bytes: int,
          out: str) -> None:
    """One rank of the module's one gang of two: the comparison with one process on
    `model_dirs` (`_compared`), then the model at `model_dir` under an address-space limit
    (`_limited`). One gang for both tests: each more would start and warm up two more
    interpreters (torch, TRL and gloo set up in each)."""
    import ctypes

    import torch.distributed as dist

    from workers.host_memory import cpu_allocator_tune, rank_mmap_threshold

    torch.set_num_threads(1)
    # As a CPU train worker's rank (RFT_TRAINER_CPU_MMAP_THRESHOLD): big blocks mapped and
    # returned when freed, so the address space follows what is held, not the heap's
    # high-water mark (and the failed whole load's blocks leave before the sharded one).
    assert cpu_allocator_tune(threshold=rank_mmap_threshold(1 << 20, world=world))
    # One malloc arena: a thread's own arena reserves 64 MB of address space at once.
    ctypes.CDLL("libc.so.6").mallopt(-8, 1)  # M_ARENA_MAX
    # A rank left alone in a collective (its peer ran out of memory) ends in bounded time.
    dist.init_process_group("gloo", init_method=addr, world_size=world, rank=rank, timeout=datetime.timedelta(seconds=300))
    _compared(rank, world, model_dirs, out)
    _limited(rank, world, warm_dir, model_dir, weight_bytes, out)
    dist.destroy_process_group()


def _limited(rank: int, world: int, warm_dir: str, model_dir: str, weight_bytes: int, out: str) -> None:
    """In the gang: warmed up on a tiny model (what the LoRA loads and step set up once),
    then held to LIMIT_SHARE of `model_dir`'s weights more address space (RLIMIT_AS): loads
    that model whole (the old way), then under the same limit takes a LoRA step on it loaded
    sharded; writes what happened to each (the step's loss, or the error) to
    out/rank{rank}-{whole,sharded}.txt."""
    import gc
    import resource

    _lora_whole(warm_dir)  # its load path warmed up too; dropped at once
    warm, shard = _lora_sharded(warm_dir, rank=rank, world=world)
    warm.step(_batch(), shard=shard)
    del warm, shard
    gc.collect()
    limit = _vm_bytes() + int(LIMIT_SHARE * weight_bytes)
    resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))
    try:
        _lora_whole(model_dir)
        result = "loaded whole"
    except (MemoryError, RuntimeError, OSError) as exc:
        result = f"failed: {type(exc).__name__}: {exc}"[:2000]
    gc.collect()
    Path(out, f"rank{rank}-whole.txt").write_text(result)
    try:
        learner, shard = _lora_sharded(model_dir, rank=rank, world=world)
        result = f"loss {learner.step(_batch(), shard=shard)['loss']}"
    except (MemoryError, RuntimeError, OSError) as exc:
        Path(out, f"rank{rank}-sharded.txt").write_text(f"failed: {type(exc).__name__}: {exc}"[:2000])
        os._exit(0)  # the other rank may be inside a collective; the outcome is written
    Path(out, f"rank{rank}-sharded.txt").write_text(result)


@pytest.fixture(scope="module")
def large_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """~100M parameters (400 MB of fp32 weights) in 24 blocks of 4M: a block gathered is
    small beside a rank's half of the weights."""
    from workers.models.tiny import tiny_model_save

    return tiny_model_save(tmp_path_factory.mktemp("large-model"), hidden_size=512, layers=24, heads=8,
                           intermediate_size=2048, seed=2)


def test_a_model_whose_weights_exceed_a_ranks_memory_trains_on_ranks_that_load_only_their_shards(
    gang_out: Path,
) -> None:
    outcome = {mode: [(gang_out / f"rank{r}-{mode}.txt").read_text() for r in (0, 1)] for mode in ("whole", "sharded")}
    # The limit bites: a rank that loads the whole model first runs out of address space.
    assert all(o.startswith("failed") for o in outcome["whole"]), outcome["whole"]
    assert any("alloc" in o.lower() or "memory" in o.lower() for o in outcome["whole"]), outcome["whole"]
    # Under the same limit, after that failure, the ranks that load only their shards train.
    assert all(o.startswith("loss") for o in outcome["sharded"]), outcome["sharded"]


# ----------------------------------------------------------------------------- rank 0 of a train worker


def _fill(run: Any, *, tag: str = "") -> None:
    """A batch of three groups of four, one prompt length, varied completions and rewards."""
    from apps.buffer.services import experience_write
    from tests.factories import experience_row

    g = torch.Generator().manual_seed(5)
    rows = []
    for gi in range(3):
        prompt = torch.randint(10, 200, (4,), generator=g).tolist()
        for j in range(4):
            completion = torch.randint(10, 200, (2 + (j * 5 + gi) % 6,), generator=g).tolist()
            rows.append(experience_row(run, key=f"{tag}g{gi}-{j}", group=f"{tag}g{gi}", token_ids=prompt + completion,
                                       prompt_length=4, logprobs=[-0.7] * len(completion),
                                       reward=float((j * 7 + gi) % 3)))
    experience_write(experiences=rows)


def _lora_group_run(owner: Any, model_dir: Path) -> Any:
    from tests.trainer.conftest import running_run

    run = running_run(owner, model_dir, train_batch_size=12, total_steps=1,
                      trainer={"learning_rate": 1e-2, "loss_type": "grpo", "processes": 2,
                               "lora": {"rank": 4, "alpha": 8.0, "target_modules": ["q_proj", "v_proj"]}})
    _fill(run)
    return run


# Rank 0 as a train worker grows by more than a bare rank (measured at load 30, the limit
# off: ~400 MB of address space on its shards only, ~620 MB loading the whole model first, on
# this 400 MB model): the share between the two.
RANK0_LIMIT_SHARE = 1.25


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(1800)
def test_a_train_workers_rank_0_trains_a_model_whose_weights_exceed_its_memory_on_its_shards_only(
    owner: Any, tiny_model_dir: Path, large_model_dir: Path, tmp_path: Path, settings: Any
) -> None:
    """Rank 0 as a train worker runs it (`trainer_step`: the resident learner, the gang, the
    version), held to RANK0_LIMIT_SHARE of the model's weights more address space after a warm-up:
    loading the whole model first fails, then building on its shards only, under the same
    limit in the same process, trains the step."""
    import json

    from tests.servers import ROOT, child_env, spawn

    weight_bytes = (large_model_dir / "model.safetensors").stat().st_size
    warm, whole, sharded = (_lora_group_run(owner, tiny_model_dir), _lora_group_run(owner, large_model_dir),
                            _lora_group_run(owner, large_model_dir))
    out, log = tmp_path / "outcome.json", tmp_path / "rank0.log"
    # Its followers inherit the limit (with more room than they need, as they start lighter
    # than a warmed-up rank 0), and one malloc arena (a thread's own reserves 64 MB at once).
    env = child_env(RFT_STORAGE_DIR=str(tmp_path / "storage"), RFT_TRAINER_CPU_MMAP_THRESHOLD=str(1 << 20),
                    MALLOC_ARENA_MAX="1")
    proc = spawn([sys.executable, str(ROOT / "tests" / "trainer" / "limited_rank0.py"), str(out), str(warm.pk),
                  str(whole.pk), str(sharded.pk), str(weight_bytes), str(RANK0_LIMIT_SHARE)], env=env, log=log)
    assert proc.wait(timeout=GANG_TIMEOUT_S) == 0, log.read_text()[-3000:]
    outcome = json.loads(out.read_text())
    tail = log.read_text()[-3000:]
    # The limit bites: a rank 0 that loads the whole model first runs out of address space.
    assert outcome["whole"].startswith("failed"), (outcome, tail)
    assert any(w in outcome["whole"].lower() for w in ("alloc", "memory")), (outcome, tail)
    assert outcome["sharded"].startswith("trained"), (outcome, tail)
