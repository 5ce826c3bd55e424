"""An algorithm is one declaration and one objective, each registered under its name: the
config accepts it, the run form offers it with its defaults, the conductor claims what it
declares, and a learner trains with its loss — no other file names it.

The persona here is a researcher adding rejection-sampling fine-tuning (RAFT: SFT on the
model's own completions that scored above zero) to rftweb."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

from apps.control.forms import algorithm_defaults, config_field_specs
from apps.control.orchestration import batch_plan
from kernel import algorithms as declarations
from kernel.algorithms import AlgorithmType, algorithm_register
from kernel.config import config_validate
from workers.algorithms import Learner, LearnerSpec, NothingToTrain, Rollout, TrainBatch
from workers.algorithms import objectives
from workers.algorithms import trl_bridge as bridge
from workers.algorithms.objectives import Objective, objective_register


class RAFT(AlgorithmType):
    name = "raft"
    summary = "SFT on the model's own completions that scored above zero"
    form_defaults = {"repeat_times": "4", "trainer.learning_rate": "1e-05", "mode": "sync"}


class RAFTObjective(Objective):
    name = "raft"
    trainers = ("sft",)

    def loss(self, learner: Any, batch: TrainBatch) -> tuple[torch.Tensor, dict[str, float]]:
        good = [r for r in batch.usual if r.reward is not None and r.reward > 0]
        if not good:
            raise NothingToTrain("no completion scored above zero")
        return learner.sft_loss(good)


@pytest.fixture
def raft_registered() -> Iterator[None]:
    algorithm_register(RAFT)
    objective_register(RAFTObjective)
    yield
    declarations.algorithm_unregister("raft")
    objectives.objective_unregister("raft")


def test_an_unregistered_algorithm_is_refused_by_name() -> None:
    with pytest.raises(Exception, match="registered algorithms: grpo, dpo, sft, mix"):
        config_validate(data={"model": "m", "algorithm": "raft"})


def test_a_registered_algorithm_reaches_the_config_the_form_and_the_conductor(raft_registered: None) -> None:
    cfg = config_validate(data={"model": "m", "algorithm": "raft", "repeat_times": 1, "train_batch_size": 6})
    # Not group-relative: one completion per task is a valid run, as the declaration says.
    assert cfg.algorithm == "raft"
    algorithm_field = next(f for f in config_field_specs() if f.path == "algorithm")
    assert algorithm_field.kind == "select" and "raft" in algorithm_field.choices
    assert algorithm_defaults()["raft"]["trainer.learning_rate"] == "1e-05"
    plan = batch_plan(cfg=cfg)
    assert (plan.usual, plan.expert, plan.whole_groups) == (6, 0, True)
    refusal = declarations.algorithm_get("raft").group_refusal(loss_type="dapo", scale_rewards="group")
    # No `learner_group` declared (its objective has no shard_loss): one process only, said by name.
    assert refusal == "raft has no sharded objective (its objective's shard_loss); set processes: 1"


def test_a_registered_objective_trains_only_on_what_it_selects(raft_registered: None, load_model: Any, tokenizer: Any) -> None:
    model = load_model()
    rows = [
        Rollout(id=i, group_id="g", prompt_ids=[11, 12, 13], completion_ids=[20 + i, 30 + i, 40],
                reward=float(i % 2))
        for i in range(4)
    ]
    learner = Learner(spec=LearnerSpec(algorithm="raft", params=bridge.LossParams(learning_rate=1e-3, max_completion_length=8)),
                      model=model, tokenizer=tokenizer)
    assert learner.sft is not None and learner.grpo is None and learner.dpo is None
    # Its loss is SFT on the rewarded half, exactly.
    loss, _ = learner.loss(TrainBatch(usual=rows))
    expected, _ = learner.sft_loss([r for r in rows if r.reward])
    assert torch.allclose(loss, expected)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    learner.step(TrainBatch(usual=rows))
    assert any(not torch.equal(p.detach(), before[n]) for n, p in model.named_parameters())
    with pytest.raises(NothingToTrain, match="scored above zero"):
        learner.loss(TrainBatch(usual=[r for r in rows if not r.reward]))
