"""A learner sharded over 2 and 3 gloo processes with PyTorch's FSDP2 (and, sharded `none`,
its DistributedDataParallel) makes the same update as one process on the whole batch: GRPO
with every loss type (one with a KL term, so a sharded reference model), DPO, SFT and MIX.
A checkpoint the gang writes through torch.distributed.checkpoint (each rank its shard)
resumes on one process and on three with the same next-step weights."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from workers.algorithms import Learner, LearnerSpec, Rollout, TrainBatch
from workers.algorithms import trl_bridge as bridge

from tests.servers import free_port

pytestmark = pytest.mark.slow

LOSS_TYPES = ("grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo", "vespo")
# (algorithm, loss_type, beta, sharding)
CASES = ([("grpo", lt, 0.0, "full") for lt in LOSS_TYPES]
         + [("grpo", "bnpo", 0.04, "full"), ("dpo", "dapo", 0.0, "full"), ("sft", "dapo", 0.0, "full"),
            ("mix", "dapo", 0.0, "full")])
# Two ranks also try the other shardings (ZeRO-2-like and DDP).
CASES_TWO = CASES + [("grpo", "grpo", 0.0, "grad_op"), ("mix", "dapo", 0.0, "grad_op"),
                     ("grpo", "dapo", 0.0, "none"), ("mix", "dapo", 0.0, "none")]


def _batch(algorithm: str, *, seed: int = 3) -> TrainBatch:
    """Four groups of three (uneven over two and three ranks), varied completion lengths,
    one masked token; MIX and SFT add expert rows. One prompt length: TRL's forward takes
    positions from 0 whatever the left padding, so a part padded differently from the
    whole batch would not be the same computation."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for gi in range(4):
        prompt = torch.randint(10, 200, (4,), generator=g).tolist()
        for j in range(3):
            completion = torch.randint(10, 200, (2 + (j * 5 + gi) % 6,), generator=g).tolist()
            mask = [1] * len(completion)
            if gi == 1 and j == 2:
                mask[0] = 0
            rows.append(Rollout(id=gi * 3 + j, group_id=f"g{gi}", prompt_ids=prompt, completion_ids=completion,
                                logprobs=[-0.7] * len(completion), reward=float((j * 7 + gi) % 3), action_mask=mask))
    expert = [Rollout(id=100 + i, group_id=f"e{i}", prompt_ids=rows[0].prompt_ids,
                      completion_ids=torch.randint(10, 200, (3 + i,), generator=g).tolist(), is_expert=True)
              for i in range(5)]
    if algorithm == "sft":
        return TrainBatch(expert=expert + rows)
    if algorithm == "mix":
        return TrainBatch(usual=rows, expert=expert)
    return TrainBatch(usual=rows)


def _spec(algorithm: str, loss_type: str, beta: float) -> LearnerSpec:
    grpo = {"loss_type": loss_type, "beta": beta, "epsilon_high": 0.28}
    settings = {"grpo": grpo, "mix": {**grpo, "mu": 0.3}}.get(algorithm)
    return LearnerSpec(algorithm=algorithm, algorithm_params=settings, params=bridge.TrainParams(learning_rate=1e-2))


def _learner(model_dir: str, spec: LearnerSpec) -> Learner:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    ref = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32) if spec.needs_ref_model else None
    return Learner(spec=spec, model=model, tokenizer=AutoTokenizer.from_pretrained(model_dir), ref_model=ref)


def _grads_kept(learner: Learner) -> dict[str, torch.Tensor]:
    """The whole gradients the optimizer steps with (filled in at each step; gathered from
    the shards, which every rank's hook does alike)."""
    names = {id(p): n for n, p in learner.model.named_parameters()}
    stepped: dict[str, torch.Tensor] = {}

    def keep(optimizer: Any, *_: Any) -> None:
        stepped.clear()
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    grad = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
                    stepped[names[id(p)]] = grad.detach().clone()

    learner.optimizer.register_step_pre_hook(keep)
    return stepped


def _whole(learner: Learner) -> dict[str, torch.Tensor]:
    from workers.algorithms.sharding import whole_state

    return whole_state(learner)


def _rank(rank: int, world: int, addr: str, addr_two: str, model_dir: str, out: str) -> None:
    """One of three processes: ranks 0 and 1 first form a gang of two (`addr_two`; rank 2
    waits) for CASES_TWO and write a checkpoint (out/two/ckpt), then all three form a gang of
    three (`addr`) for CASES and resume the two ranks' checkpoint (out/three/three.pt). Each
    case's update is saved (rank 0's whole weights and gradients, or every rank's under DDP).
    One set of processes for both gangs, so each imports torch and TRL once (five starts
    were most of the module's time)."""
    if rank < 2:
        # As a CPU train worker with RFT_TRAINER_CPU_MMAP_THRESHOLD: the heap trimmed after
        # each block's backward (workers/host_memory.py) changes no update.
        from workers.host_memory import cpu_allocator_tune

        assert cpu_allocator_tune()
        _gang(rank, 2, addr_two, model_dir, CASES_TWO, Path(out) / "two")
    _gang(rank, world, addr, model_dir, CASES, Path(out) / "three")
    # Every algorithm's TRL trainer was built here without importing vLLM or MLflow, which
    # TRL's GRPO trainer otherwise imports (~5 CPU s a process; workers/algorithms/trl_bridge.py).
    assert not {"vllm", "mlflow"} & set(sys.modules), "a learner process imported vLLM or MLflow"


def _gang(rank: int, world: int, addr: str, model_dir: str, cases: list[tuple[str, str, float, str]], out: Path) -> None:
    """In a gang of `world` (the default process group, ended at the end): each case's
    update, then two ranks write a checkpoint and three resume the one two wrote."""
    import torch.distributed as dist

    from workers.algorithms.sharding import learner_shard

    dist.init_process_group("gloo", init_method=addr, world_size=world, rank=rank)
    try:
        for i, (algorithm, loss_type, beta, sharding) in enumerate(cases):
            learner = _learner(model_dir, _spec(algorithm, loss_type, beta))
            shard = learner_shard(learner, rank=rank, world=world, sharding=sharding)
            grads = _grads_kept(learner)
            metrics = learner.step(_batch(algorithm), shard=shard)
            params = _whole(learner) if sharding != "none" else {n: p.detach() for n, p in learner.model.named_parameters()}
            if rank == 0 or sharding == "none":
                torch.save({"params": params, "grads": grads, "loss": metrics["loss"], "term": shard.last_term},
                           out / f"case{i}-rank{rank}.pt")
        if world == 2:
            _ckpt_write(rank, world, model_dir, out / "ckpt")
        else:
            _ckpt_resume(rank, world, model_dir, out.parent / "two" / "ckpt", out / "three.pt")
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def gangs(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    """The gangs' outputs by world size (two/: CASES_TWO, then a checkpoint, ckpt/; three/:
    CASES, then that checkpoint resumed, three.pt), from three processes started once."""
    import torch.multiprocessing as mp

    out = tmp_path_factory.mktemp("learner-gangs")
    for world in (2, 3):
        (out / ("two", "three")[world - 2]).mkdir()
    mp.start_processes(_rank, args=(3, f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}",
                                    str(tiny_model_dir), str(out)), nprocs=3, start_method="spawn")
    return {2: out / "two", 3: out / "three"}


_ONE: dict[tuple[str, str, float], dict[str, Any]] = {}


def _one_process(model_dir: Path, algorithm: str, loss_type: str, beta: float) -> dict[str, Any]:
    key = (algorithm, loss_type, beta)
    if key not in _ONE:
        learner = _learner(str(model_dir), _spec(algorithm, loss_type, beta))
        grads = _grads_kept(learner)
        metrics = learner.step(_batch(algorithm))
        _ONE[key] = {"params": {n: p.detach().clone() for n, p in learner.model.state_dict().items()},
                     "grads": dict(grads), "loss": metrics["loss"]}
    return _ONE[key]


@pytest.mark.parametrize("world", [2, 3])
def test_a_sharded_learner_makes_the_one_process_update_for_every_algorithm_and_loss_type(
    tiny_model_dir: Path, gangs: dict[int, Path], world: int
) -> None:
    cases = CASES_TWO if world == 2 else CASES
    out = gangs[world]
    before = dict(_learner(str(tiny_model_dir), _spec("sft", "dapo", 0.0)).model.state_dict())
    for i, (algorithm, loss_type, beta, sharding) in enumerate(cases):
        case = f"{algorithm}/{loss_type}/beta={beta}/{sharding} on {world} ranks"
        one = _one_process(tiny_model_dir, algorithm, loss_type, beta)
        got = torch.load(out / f"case{i}-rank0.pt")
        assert got["grads"].keys() == one["grads"].keys(), case
        for name, grad in one["grads"].items():
            # Partial sums per rank, then the reduction: float noise only.
            torch.testing.assert_close(got["grads"][name], grad, atol=1e-6, rtol=1e-4, msg=lambda m: f"{case}: {name}: {m}")
        for name, value in one["params"].items():
            # Adam's first step divides by |grad|: a weight whose gradient is ~eps moves by up
            # to lr on noise alone, hence a looser bound on the weights than on the gradients.
            torch.testing.assert_close(got["params"][name], value, atol=1e-4, rtol=1e-3, msg=lambda m: f"{case}: {name}: {m}")
        assert any(not torch.equal(before[n], one["params"][n]) for n in before), f"{case}: the step changed nothing"
        assert got["loss"] == pytest.approx(one["loss"], abs=1e-5), f"{case}: the gang's loss metric is not the batch's"
        if sharding == "none":  # DDP: every rank holds the same whole weights
            other = torch.load(out / f"case{i}-rank1.pt")
            for name, value in got["params"].items():
                torch.testing.assert_close(other["params"][name], value, atol=0, rtol=0)


# ----------------------------------------------------------------------------- sharded checkpoints


def _ckpt_write(rank: int, world: int, model_dir: str, path: Path) -> None:
    """In a gang: one GRPO step on the whole model sharded, then the checkpoint, each rank its shard."""
    from workers.algorithms.sharding import learner_shard, sharded_save

    learner = _learner(model_dir, _spec("grpo", "dapo", 0.0))
    shard = learner_shard(learner, rank=rank, world=world, sharding="full")
    learner.step(_batch("grpo"), shard=shard)
    sharded_save(learner, path)


def _ckpt_resume(rank: int, world: int, model_dir: str, path: Path, out: Path) -> None:
    """In a gang: the checkpoint at `path` loaded into a fresh sharded learner, the next step
    taken, the whole weights saved to `out` (rank 0)."""
    from workers.algorithms.sharding import learner_shard, sharded_load, whole_state

    learner = _learner(model_dir, _spec("grpo", "dapo", 0.0))
    shard = learner_shard(learner, rank=rank, world=world, sharding="full")
    sharded_load(learner, path)
    learner.step(_batch("grpo", seed=4), shard=shard)
    params = whole_state(learner)
    if rank == 0:
        torch.save(params, out)


def test_a_checkpoint_two_ranks_wrote_resumes_on_one_process_and_on_three_to_the_same_next_step(
    tiny_model_dir: Path, gangs: dict[int, Path]
) -> None:
    from workers.algorithms.sharding import sharded_load

    ckpt = gangs[2] / "ckpt"
    assert sorted(p.name for p in ckpt.glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"], "each rank its shard"
    three = torch.load(gangs[3] / "three.pt")

    one = _learner(str(tiny_model_dir), _spec("grpo", "dapo", 0.0))
    sharded_load(one, ckpt)
    one.step(_batch("grpo", seed=4))
    # The run that never stopped: both steps in one process.
    straight = _learner(str(tiny_model_dir), _spec("grpo", "dapo", 0.0))
    straight.step(_batch("grpo"))
    straight.step(_batch("grpo", seed=4))
    for name, value in straight.model.state_dict().items():
        torch.testing.assert_close(one.model.state_dict()[name], value, atol=1e-5, rtol=1e-4, msg=lambda m: f"{name}: {m}")
        torch.testing.assert_close(three[name], one.model.state_dict()[name], atol=1e-5, rtol=1e-4,
                                   msg=lambda m: f"{name}: {m}")
    assert int(one.optimizer.state_dict()["state"][0]["step"]) == 2, "the optimizer's state came back with the weights"
