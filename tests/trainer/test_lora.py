"""LoRA through peft: only the adapter trains, the base with the adapter off is the KL
reference (no second model), and what a step publishes is an adapter that explorers load
and generate the trainer's own greedy text with."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from kernel.config import AdapterConfig
from workers.weights.adapters import adapter_wrap
from workers.algorithms import Learner, LearnerSpec, Rollout, TrainBatch
from workers.algorithms import trl_bridge as bridge
from workers.algorithms.objectives import grpo

pytestmark = pytest.mark.slow

LORA = AdapterConfig(rank=4, alpha=8.0, dropout=0.0, target_modules=["q_proj", "v_proj", "up_proj", "down_proj"])


def _rollouts(*, groups: int = 2, size: int = 4, seed: int = 0) -> list[Rollout]:
    g = torch.Generator().manual_seed(seed)
    rows = []
    for gi in range(groups):
        prompt = torch.randint(10, 200, (3 + gi,), generator=g).tolist()
        for j in range(size):
            completion = torch.randint(10, 200, (2 + (j + gi) % 4,), generator=g).tolist()
            rows.append(Rollout(id=gi * size + j, group_id=f"g{gi}", prompt_ids=prompt, completion_ids=completion,
                                logprobs=None, reward=float((j * 7 + gi) % 3)))
    return rows


def _lora_learner(load_model: Any, tokenizer: Any, *, algorithm: str = "grpo", beta: float = 0.0, **spec: Any) -> Learner:
    torch.manual_seed(0)
    model = adapter_wrap(model=load_model(), lora=LORA)
    params = bridge.TrainParams(learning_rate=1e-2)
    settings = {"loss_type": "grpo", "beta": beta} if algorithm in ("grpo", "mix") else None
    return Learner(spec=LearnerSpec(algorithm=algorithm, params=params, algorithm_params=settings, lora=LORA, **spec),
                   model=model, tokenizer=tokenizer)


def test_a_grpo_step_with_an_adapter_changes_the_adapter_and_nothing_else(load_model: Any, tokenizer: Any) -> None:
    learner = _lora_learner(load_model, tokenizer, beta=0.05)
    before = {n: p.detach().clone() for n, p in learner.model.named_parameters()}
    trainable = {n for n, p in learner.model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable), "something besides the adapter would train"
    # The optimizer holds the adapter only (full AdamW state for the base is what LoRA saves).
    in_optimizer = {id(p) for group in learner.optimizer.param_groups for p in group["params"]}
    assert in_optimizer == {id(p) for n, p in learner.model.named_parameters() if n in trainable}

    learner.step(TrainBatch(usual=_rollouts()))
    learner.step(TrainBatch(usual=_rollouts(seed=1)))

    changed = {n for n, p in learner.model.named_parameters() if not torch.equal(p.detach(), before[n])}
    assert changed, "the step changed nothing"
    assert changed <= trainable
    assert any("lora_A" in n for n in changed) and any("lora_B" in n for n in changed)


def test_the_kl_reference_is_the_base_model_and_no_second_copy_is_held(load_model: Any, tokenizer: Any) -> None:
    learner = _lora_learner(load_model, tokenizer, beta=0.1)
    assert learner.ref_model is None
    assert set(learner.model.peft_config) == {"default"}, "TRL's frozen adapter copy is still there"
    learner.step(TrainBatch(usual=_rollouts()))
    learner.step(TrainBatch(usual=_rollouts(seed=1)))

    rollouts = _rollouts(seed=2)
    objective = learner.objective
    assert isinstance(objective, grpo.GRPO)
    inputs = grpo.inputs_build(
        trainer=objective.trainer, prompt_ids=[r.prompt_ids for r in rollouts],
        completion_ids=[r.completion_ids for r in rollouts], old_logprobs=None, advantages=torch.zeros(len(rollouts)),
    )
    ref = objective.reference_logps(inputs)
    policy = grpo.ref_logps(trainer=objective.trainer, ref_model=learner.model, inputs=inputs)
    base = load_model()  # the untouched base, loaded apart only to compare with
    base.eval()
    expected = grpo.ref_logps(trainer=objective.trainer, ref_model=base, inputs=inputs)
    mask = inputs["completion_mask"].bool()
    torch.testing.assert_close(ref[mask], expected[mask], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(policy[mask], expected[mask], atol=1e-4), "the adapter changed nothing the reference could miss"
    # The KL term is live: the loss reports it, and it is no longer zero after training.
    _, metrics = learner.loss(TrainBatch(usual=rollouts))
    assert metrics["kl"] > 0


def test_dpo_with_an_adapter_needs_no_reference_model(load_model: Any, tokenizer: Any) -> None:
    learner = _lora_learner(load_model, tokenizer, algorithm="dpo")
    rows = _rollouts(groups=1)
    metrics = learner.step(TrainBatch(usual=rows, preferences=[(rows[0].id, rows[1].id)]))
    assert metrics["loss"] > 0 and set(learner.model.peft_config) == {"default"}


def test_adapter_targets_that_the_model_lacks_are_named(load_model: Any) -> None:
    from workers.weights.adapters import AdapterTargetsMissing

    with pytest.raises(AdapterTargetsMissing, match="target_modules"):
        adapter_wrap(model=load_model(), lora=LORA.model_copy(update={"target_modules": ["wq", "wk"]}))
