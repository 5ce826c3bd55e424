"""A learner as two gloo processes makes the same update as one process on the same batch
(GRPO per-sequence and per-token losses, SFT), and refuses what does not split exactly."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

from workers.algorithms import Learner, LearnerSpec, Rollout, TrainBatch
from workers.algorithms import trl_bridge as bridge
from workers.algorithms.distributed import GroupShard, GroupUnsupported

from tests.servers import free_port

pytestmark = pytest.mark.slow


def _batch(algorithm: str) -> TrainBatch:
    """Three groups (uneven over two ranks) of varied completion lengths. Prompts share one
    length: TRL's forward takes positions from 0 whatever the left padding, so a batch
    padded differently in each part would not be the same computation."""
    g = torch.Generator().manual_seed(3)
    rows = []
    for gi in range(3):
        prompt = torch.randint(10, 200, (4,), generator=g).tolist()
        for j in range(4):
            completion = torch.randint(10, 200, (2 + (j * 5 + gi) % 6,), generator=g).tolist()
            rows.append(Rollout(id=gi * 4 + j, group_id=f"g{gi}", prompt_ids=prompt, completion_ids=completion,
                                logprobs=None, reward=float((j * 7 + gi) % 3)))
    return TrainBatch(usual=rows) if algorithm == "grpo" else TrainBatch(expert=rows)


def _spec(algorithm: str, loss_type: str) -> LearnerSpec:
    return LearnerSpec(algorithm=algorithm, params=bridge.LossParams(loss_type=loss_type, learning_rate=1e-2))


def _learner(model_dir: str, spec: LearnerSpec) -> tuple[Learner, dict[str, Any]]:
    """A learner, and the gradients its optimizer stepped with last (filled in by each step)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    learner = Learner(spec=spec, model=model, tokenizer=AutoTokenizer.from_pretrained(model_dir))
    names = {id(p): n for n, p in model.named_parameters()}

    stepped: dict[str, Any] = {}

    def keep(optimizer: Any, *_: Any) -> None:
        stepped.clear()
        stepped.update({names[id(p)]: p.grad.detach().clone() for g in optimizer.param_groups
                        for p in g["params"] if p.grad is not None})

    learner.optimizer.register_step_pre_hook(keep)
    return learner, stepped


def _rank(rank: int, world: int, addr: str, model_dir: str, algorithm: str, loss_type: str, out: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=addr, world_size=world, rank=rank)
    try:
        learner, stepped = _learner(model_dir, _spec(algorithm, loss_type))
        shard = GroupShard(rank=rank, world=world)
        metrics = [learner.step(_batch(algorithm), shard=shard)]
        torch.save({"params": {n: p.detach() for n, p in learner.model.named_parameters()}, "grads": stepped,
                    "loss": metrics[0]["loss"], "share": shard.last_share}, os.path.join(out, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize(("algorithm", "loss_type"), [("grpo", "grpo"), ("grpo", "dapo"), ("sft", "dapo")])
def test_two_gloo_processes_make_the_one_process_update(
    tiny_model_dir: Path, tmp_path: Path, algorithm: str, loss_type: str
) -> None:
    import torch.multiprocessing as mp

    single, expected_grads = _learner(str(tiny_model_dir), _spec(algorithm, loss_type))
    first = single.step(_batch(algorithm))
    expected = {n: p.detach() for n, p in single.model.named_parameters()}
    before = {n: p.detach() for n, p in _learner(str(tiny_model_dir), _spec(algorithm, loss_type))[0].model.named_parameters()}

    mp.start_processes(_rank, args=(2, f"tcp://127.0.0.1:{free_port()}", str(tiny_model_dir), algorithm, loss_type, str(tmp_path)),
                       nprocs=2, start_method="spawn")
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    assert 0 < ranks[0]["share"] < 1 and ranks[0]["share"] + ranks[1]["share"] == pytest.approx(1.0)
    assert ranks[0]["grads"].keys() == expected_grads.keys()
    for name, grad in expected_grads.items():
        # The group's summed gradient is the batch's: the summation order differs (two
        # partial sums, then the all-reduce), so float noise only.
        torch.testing.assert_close(ranks[0]["grads"][name], grad, atol=1e-6, rtol=1e-4)
    for name, value in expected.items():
        torch.testing.assert_close(ranks[0]["params"][name], ranks[1]["params"][name], atol=0, rtol=0)
        # Adam's first step divides by |grad|: a weight whose gradient is ~eps moves by up to
        # lr on noise alone, hence a looser bound on the weights than on the gradients.
        torch.testing.assert_close(ranks[0]["params"][name], value, atol=1e-4, rtol=1e-3)
    assert any(not torch.equal(before[n], expected[n]) for n in expected), "the step changed nothing"
    assert ranks[0]["loss"] == pytest.approx(first["loss"], abs=1e-5), "the group's loss metric is not the batch's"


@pytest.mark.parametrize(("algorithm", "loss_type", "message"), [
    ("grpo", "cispo", "does not split exactly"),
    ("dpo", "dapo", "runs in one process"),
    ("mix", "dapo", "runs in one process"),
])
def test_what_does_not_split_exactly_is_refused(tiny_model_dir: Path, algorithm: str, loss_type: str, message: str) -> None:
    from workers.algorithms.distributed import group_supported

    reason = group_supported(_spec(algorithm, loss_type))
    assert reason is not None and message in reason
    if algorithm == "grpo":
        learner, _ = _learner(str(tiny_model_dir), _spec(algorithm, loss_type))
        with pytest.raises(GroupUnsupported, match=message):
            learner.step(_batch("grpo"), shard=GroupShard(rank=0, world=2))
