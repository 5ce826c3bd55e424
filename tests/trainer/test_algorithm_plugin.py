"""An algorithm with a loss of its own is one file and one registration line.

The persona is a researcher adding reward-weighted likelihood (RWL: each completion token's
log-likelihood weighted by its reward minus a baseline, a loss no TRL trainer has) to
rftweb. This file is all of it: its settings (a parameter model, torch-free), its objective
(its loss, its no-gradient check and its term on one rank of a learner group, torch imported
when a learner builds it) and its declaration; `algorithm_register(RWL)` is the one line
that adds it. With it the config validates its settings as `trainer.params`, the run form
offers it, the conductor claims what it declares, a learner trains a step with its loss,
and a learner group of two ranks makes the same step."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from pydantic import Field

from kernel.algorithms import AlgorithmParams, AlgorithmType, algorithm_register, algorithm_unregister
from workers.algorithms import NothingToTrain, Rollout, TrainBatch
from workers.algorithms.batch import trainable
from workers.algorithms.objectives import Objective, weighted_part

from tests.servers import free_port

if TYPE_CHECKING:
    import torch

    from workers.algorithms import Learner

# ----------------------------------------------------------------------------- the plugin


class RWLParams(AlgorithmParams):
    # Rewards above it pull a completion's tokens up, rewards below push them down.
    baseline: float = Field(0.5, ge=-1e6, le=1e6)


class RWLObjective(Objective):
    """−Σ (reward − baseline)·log π(token) over the action tokens of the scored usual
    rollouts, divided by their number: a per-token mean, so a rank's part weighs its share
    of the tokens."""

    name = "rwl"

    def __init__(self, learner: Learner) -> None:
        super().__init__(learner)
        settings = learner.spec.settings
        assert isinstance(settings, RWLParams)
        self.baseline = settings.baseline

    def rows(self, batch: TrainBatch) -> list[Rollout]:
        rows = [r for r in trainable(batch.usual) if r.reward is not None]
        if not rows:
            raise NothingToTrain("no scored rollout with a token the model wrote")
        return rows

    def loss_on(self, rows: list[Rollout]) -> tuple[torch.Tensor, dict[str, float]]:
        import torch

        width = max(len(r.prompt_ids) + len(r.completion_ids) for r in rows)
        ids = torch.zeros(len(rows), width, dtype=torch.long)
        attention = torch.zeros(len(rows), width, dtype=torch.long)
        weights = torch.zeros(len(rows), width)
        actions = torch.zeros(len(rows), width)
        for i, r in enumerate(rows):
            start, end = len(r.prompt_ids), len(r.prompt_ids) + len(r.completion_ids)
            ids[i, :end] = torch.tensor(r.prompt_ids + r.completion_ids)
            attention[i, :end] = 1
            actions[i, start:end] = torch.tensor(r.trained_mask, dtype=torch.float32)
            weights[i, start:end] = actions[i, start:end] * (float(r.reward or 0.0) - self.baseline)
        device = next(self.learner.model.parameters()).device
        logits = self.learner.forward_model(input_ids=ids.to(device), attention_mask=attention.to(device)).logits
        logps = torch.log_softmax(logits[:, :-1].float(), dim=-1).gather(-1, ids[:, 1:, None].to(device)).squeeze(-1)
        loss = -(logps * weights[:, 1:].to(device)).sum() / actions.sum()
        return loss, {"weighted_tokens": float(actions.sum())}

    def loss(self, batch: TrainBatch) -> tuple[torch.Tensor, dict[str, float]]:
        return self.loss_on(self.rows(batch))

    def no_gradient(self, batch: TrainBatch) -> str | None:
        rows = [r for r in trainable(batch.usual) if r.reward is not None]
        if rows and all(r.reward == self.baseline for r in rows):
            return "every reward equals the baseline"
        return None

    def shard_loss(self, batch: TrainBatch, *, rank: int, world: int) -> tuple[torch.Tensor, dict[str, float]]:
        return weighted_part(self.loss_on, self.rows(batch), rank=rank, world=world,
                             weight=lambda part: float(sum(r.action_count for r in part)))


class RWL(AlgorithmType):
    name = "rwl"
    summary = "each completion token's log-likelihood weighted by its reward minus a baseline"
    objective = RWLObjective
    params = RWLParams
    learner_group = True
    form_defaults = {"repeat_times": "4", "trainer.learning_rate": "1e-05", "trainer.params": "baseline: 0.5",
                     "mode": "sync"}


def rwl_registered() -> None:
    algorithm_register(RWL)  # the one registration line


# ----------------------------------------------------------------------------- the tests


@pytest.fixture
def rwl() -> Iterator[None]:
    rwl_registered()
    yield
    algorithm_unregister("rwl")


def test_an_unregistered_algorithm_is_refused_by_name() -> None:
    from kernel.config import ConfigInvalid, config_validate

    with pytest.raises(ConfigInvalid, match="registered algorithms: grpo, dpo, sft, mix"):
        config_validate(data={"model": "m", "algorithm": "rwl"})


def test_its_declaration_reaches_the_config_the_form_and_the_conductor(rwl: None) -> None:
    from apps.control.forms import algorithm_defaults, config_field_specs
    from apps.control.conductor import batch_plan
    from kernel.config import ConfigInvalid, config_dump, config_validate

    cfg = config_validate(data={"model": "m", "algorithm": "rwl", "repeat_times": 1, "train_batch_size": 6,
                                "trainer": {"params": {"baseline": 0.25}}})
    assert isinstance(cfg.trainer.params, RWLParams) and cfg.trainer.params.baseline == 0.25
    dumped: Any = config_dump(cfg)
    assert dumped["trainer"]["params"] == {"baseline": 0.25}
    assert config_validate(data=config_dump(cfg)) == cfg
    with pytest.raises(ConfigInvalid) as bad:
        config_validate(data={"model": "m", "algorithm": "rwl", "trainer": {"params": {"loss_type": "dapo"}}})
    assert bad.value.errors == {"trainer.params.loss_type": "unknown key 'loss_type'"}
    algorithm_field = next(f for f in config_field_specs() if f.path == "algorithm")
    assert algorithm_field.kind == "select" and "rwl" in algorithm_field.choices
    assert algorithm_defaults()["rwl"]["trainer.params"] == "baseline: 0.5"
    plan = batch_plan(cfg=cfg)
    assert (plan.usual, plan.expert, plan.whole_groups) == (6, 0, True)


def _rows(seed: int = 0) -> list[Rollout]:
    """Two groups of three with rewards 0, 0.5 and 1 (one row's first token masked), and
    uneven completion lengths: dealt over two ranks the parts differ in tokens."""
    import torch

    g = torch.Generator().manual_seed(seed)
    rows = []
    for gi in range(2):
        prompt = torch.randint(10, 200, (3,), generator=g).tolist()
        for j in range(3):
            completion = torch.randint(10, 200, (2 + 2 * j + gi,), generator=g).tolist()
            mask = [0 if (gi, j, k) == (1, 2, 0) else 1 for k in range(len(completion))]
            rows.append(Rollout(id=gi * 3 + j, group_id=f"g{gi}", prompt_ids=prompt, completion_ids=completion,
                                reward=0.5 * j, action_mask=mask))
    return rows


def _learner(model_dir: str) -> Learner:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from workers.algorithms import Learner, LearnerSpec
    from workers.algorithms import trl_bridge as bridge

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    spec = LearnerSpec(algorithm="rwl", params=bridge.TrainParams(learning_rate=1e-2), algorithm_params={"baseline": 0.5})
    return Learner(spec=spec, model=model, tokenizer=AutoTokenizer.from_pretrained(model_dir))


def test_a_learner_trains_a_step_with_its_loss(rwl: None, tiny_model_dir: Path) -> None:
    import torch

    learner = _learner(str(tiny_model_dir))
    assert isinstance(learner.objective, RWLObjective)
    rows = _rows()
    # Rows rewarded at the baseline weigh nothing: the loss is the other rows' alone.
    loss, metrics = learner.loss(TrainBatch(usual=rows))
    off_baseline, _ = learner.objective.loss_on([r for r in rows if r.reward != 0.5])
    tokens = sum(r.action_count for r in rows)
    assert metrics["weighted_tokens"] == tokens
    torch.testing.assert_close(loss, off_baseline * sum(r.action_count for r in rows if r.reward != 0.5) / tokens)
    before = {n: p.detach().clone() for n, p in learner.model.named_parameters()}
    metrics = learner.step(TrainBatch(usual=rows))
    assert metrics["train/skipped_no_signal"] == 0.0 and metrics["grad_norm"] > 0
    assert any(not torch.equal(p.detach(), before[n]) for n, p in learner.model.named_parameters())
    # Its no-gradient check: every reward at the baseline leaves the weights as they were.
    flat = [Rollout(**{**r.__dict__, "reward": 0.5}) for r in rows]
    after = {n: p.detach().clone() for n, p in learner.model.named_parameters()}
    assert learner.step(TrainBatch(usual=flat))["train/skipped_no_signal"] == 1.0
    assert all(torch.equal(p.detach(), after[n]) for n, p in learner.model.named_parameters())
    with pytest.raises(NothingToTrain, match="no scored rollout"):
        learner.loss(TrainBatch(usual=[Rollout(**{**r.__dict__, "reward": None}) for r in rows]))


def _rank(rank: int, world: int, addr: str, model_dir: str, out: str) -> None:
    """One rank of a learner group of `world` (a spawned process: it registers the
    algorithm as any process that imports this file and calls the registration would)."""
    import torch
    import torch.distributed as dist

    from workers.algorithms.distributed import learner_shard, whole_state

    rwl_registered()
    dist.init_process_group("gloo", init_method=addr, world_size=world, rank=rank)
    try:
        learner = _learner(model_dir)
        shard = learner_shard(learner, rank=rank, world=world, sharding="full")
        metrics = learner.step(TrainBatch(usual=_rows()), shard=shard)
        params = whole_state(learner)
        if rank == 0:
            torch.save({"params": params, "loss": metrics["loss"]}, os.path.join(out, "rank0.pt"))
    finally:
        dist.destroy_process_group()


def test_a_learner_group_of_two_ranks_makes_the_one_process_step(rwl: None, tiny_model_dir: Path, tmp_path: Path) -> None:
    import torch
    import torch.multiprocessing as mp

    mp.start_processes(_rank, args=(2, f"tcp://127.0.0.1:{free_port()}", str(tiny_model_dir), str(tmp_path)),
                       nprocs=2, start_method="spawn")
    group: dict[str, Any] = torch.load(tmp_path / "rank0.pt")
    learner = _learner(str(tiny_model_dir))
    before = {n: p.detach().clone() for n, p in learner.model.state_dict().items()}
    one = learner.step(TrainBatch(usual=_rows()))
    assert group["loss"] == pytest.approx(one["loss"], abs=1e-5)
    for name, value in learner.model.state_dict().items():
        torch.testing.assert_close(group["params"][name], value, atol=1e-4, rtol=1e-3, msg=lambda m: f"{name}: {m}")
    assert any(not torch.equal(before[n], v) for n, v in learner.model.state_dict().items()), "the step changed nothing"
