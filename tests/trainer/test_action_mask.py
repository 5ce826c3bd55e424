"""The trainer honours the action mask: tokens the model did not sample (an environment's
reply, a tool's output, a masked truncated response) are context, never trained on.

The check in each test: a batch whose completions carry environment tokens with mask 0 —
before the model's own tokens (they belong to the context the model saw) and after them
(they add nothing the model could be blamed for) — gives the same loss, the same gradients,
the same token-count normalisation and the same metrics as the same batch with those
tokens moved into the prompt (leading) or cut off (trailing). The masked tokens carry
placeholder logprobs far from the truth, as environments send them, so a loss that read them
would differ.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from workers.algorithms import (
    Learner,
    LearnerSpec,
    NothingToTrain,
    Rollout,
    TrainBatch,
    rollout_from_experience,
)
from tests.trainer.gradients import TOL, assert_same_grads, true_logprobs
from workers.algorithms import trl_bridge as bridge

pytestmark = pytest.mark.slow

LOSS_TYPES = ["grpo", "dapo", "dr_grpo", "bnpo", "cispo", "sapo", "luspo", "vespo"]


def _pair(model: Any, *, expert: bool = False, seed: int = 0) -> tuple[list[Rollout], list[Rollout]]:
    """(masked, removed): the same rows, once with environment tokens in the completion
    under mask 0 (placeholder logprob -30 on them: what no model gave), once without them."""
    g = torch.Generator().manual_seed(seed)
    masked, removed = [], []
    for gi in range(2):
        prompt = torch.randint(10, 200, (3 + gi,), generator=g).tolist()
        for j in range(4):
            lead = torch.randint(10, 200, ((j + gi) % 3,), generator=g).tolist()
            own = torch.randint(10, 200, (2 + (j * 3 + gi) % 4,), generator=g).tolist()
            tail = torch.randint(10, 200, ((j * 2 + gi) % 4,), generator=g).tolist()
            true = true_logprobs(model, prompt + lead, own)
            noise = (torch.rand(len(true), generator=g) - 0.5) * 0.8
            own_logprobs = [t + float(n) for t, n in zip(true, noise)]
            common: dict[str, Any] = {"id": gi * 4 + j, "group_id": f"g{gi}", "reward": float((j * 7 + gi) % 3), "is_expert": expert}
            masked.append(Rollout(
                prompt_ids=prompt, completion_ids=lead + own + tail,
                logprobs=[-30.0] * len(lead) + own_logprobs + [-30.0] * len(tail),
                action_mask=[0] * len(lead) + [1] * len(own) + [0] * len(tail), **common,
            ))
            removed.append(Rollout(prompt_ids=prompt + lead, completion_ids=own, logprobs=own_logprobs, **common))
    assert any(r.action_mask and r.action_mask[0] == 0 for r in masked)
    assert any(r.action_mask and r.action_mask[-1] == 0 for r in masked)
    return masked, removed


def _compare(load_model: Any, tokenizer: Any, *, spec: LearnerSpec, batches: Any, ref: bool = False) -> dict[str, float]:
    a_model, b_model = load_model(), load_model()
    masked, removed = batches(a_model)
    results = []
    for model, batch in ((a_model, masked), (b_model, removed)):
        learner = Learner(spec=spec, model=model, tokenizer=tokenizer, ref_model=load_model() if ref else None)
        loss, metrics = learner.loss(batch)
        loss.backward()
        results.append((loss, metrics))
    (a_loss, a_metrics), (b_loss, b_metrics) = results
    torch.testing.assert_close(a_loss, b_loss, atol=TOL, rtol=TOL)
    assert_same_grads(a_model, b_model)
    assert a_metrics.keys() == b_metrics.keys()
    for name in a_metrics:
        assert a_metrics[name] == pytest.approx(b_metrics[name], abs=TOL), name
    return a_metrics


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_grpo_with_environment_tokens_masked_equals_grpo_without_them(load_model: Any, tokenizer: Any, loss_type: str) -> None:
    spec = LearnerSpec(algorithm="grpo", params=bridge.TrainParams(max_completion_length=16),
                       algorithm_params={"loss_type": loss_type})

    def batches(model: Any) -> tuple[TrainBatch, TrainBatch]:
        masked, removed = _pair(model)
        return TrainBatch(usual=masked), TrainBatch(usual=removed)

    metrics = _compare(load_model, tokenizer, spec=spec, batches=batches)
    assert "entropy" in metrics


def test_grpo_with_kl_to_the_reference_counts_only_action_tokens(load_model: Any, tokenizer: Any) -> None:
    spec = LearnerSpec(algorithm="grpo", params=bridge.TrainParams(max_completion_length=16),
                       algorithm_params={"loss_type": "dapo", "beta": 0.1})

    def batches(model: Any) -> tuple[TrainBatch, TrainBatch]:
        masked, removed = _pair(model, seed=3)
        return TrainBatch(usual=masked), TrainBatch(usual=removed)

    assert "kl" in _compare(load_model, tokenizer, spec=spec, batches=batches, ref=True)


def test_sft_with_environment_tokens_masked_equals_sft_without_them(load_model: Any, tokenizer: Any) -> None:
    spec = LearnerSpec(algorithm="sft", params=bridge.TrainParams())

    def batches(model: Any) -> tuple[TrainBatch, TrainBatch]:
        masked, removed = _pair(model, expert=True, seed=1)
        return TrainBatch(expert=masked), TrainBatch(expert=removed)

    metrics = _compare(load_model, tokenizer, spec=spec, batches=batches)
    assert "token_accuracy" in metrics and "entropy" in metrics


def test_mix_with_environment_tokens_masked_equals_mix_without_them(load_model: Any, tokenizer: Any) -> None:
    spec = LearnerSpec(algorithm="mix", params=bridge.TrainParams(max_completion_length=16),
                       algorithm_params={"loss_type": "grpo", "mu": 0.4})

    def batches(model: Any) -> tuple[TrainBatch, TrainBatch]:
        usual_m, usual_r = _pair(model, seed=2)
        expert_m, expert_r = _pair(model, expert=True, seed=4)
        return TrainBatch(usual=usual_m, expert=expert_m), TrainBatch(usual=usual_r, expert=expert_r)

    metrics = _compare(load_model, tokenizer, spec=spec, batches=batches)
    assert {"grpo_loss", "sft_loss"} <= metrics.keys()


def _dpo_pairs(model: Any, *, seed: int = 5) -> tuple[list[Rollout], list[Rollout]]:
    """(masked, removed) for DPO: per group a better and a worse rollout of one prompt. The
    environment tokens leading the completion are the same for both (they are context the
    model saw), so moving them into the prompt keeps the pair's shared prompt."""
    g = torch.Generator().manual_seed(seed)
    masked, removed = [], []
    for gi in range(3):
        prompt = torch.randint(10, 200, (3 + gi,), generator=g).tolist()
        lead = torch.randint(10, 200, (gi % 3,), generator=g).tolist()
        for j, reward in enumerate((1.0, 0.0)):
            own = torch.randint(10, 200, (2 + (gi + j) % 3,), generator=g).tolist()
            tail = torch.randint(10, 200, ((gi + 2 * j) % 3,), generator=g).tolist()
            common: dict[str, Any] = {"id": gi * 2 + j, "group_id": f"g{gi}", "reward": reward}
            masked.append(Rollout(prompt_ids=prompt, completion_ids=lead + own + tail,
                                  logprobs=[-30.0] * (len(lead) + len(own) + len(tail)),
                                  action_mask=[0] * len(lead) + [1] * len(own) + [0] * len(tail), **common))
            removed.append(Rollout(prompt_ids=prompt + lead, completion_ids=own, **common))
    assert any(r.action_mask and r.action_mask[0] == 0 for r in masked)
    assert any(r.action_mask and r.action_mask[-1] == 0 for r in masked)
    return masked, removed


def test_dpo_with_environment_tokens_masked_equals_dpo_without_them(load_model: Any, tokenizer: Any) -> None:
    spec = LearnerSpec(algorithm="dpo", params=bridge.TrainParams(), algorithm_params={"beta": 0.5})

    def batches(model: Any) -> tuple[TrainBatch, TrainBatch]:
        masked, removed = _dpo_pairs(model)
        return TrainBatch(usual=masked), TrainBatch(usual=removed)

    metrics = _compare(load_model, tokenizer, spec=spec, batches=batches, ref=True)
    assert metrics["pairs"] == 3 and "reward_margin" in metrics


def test_dpo_without_the_mask_would_train_on_the_environments_tokens(load_model: Any, tokenizer: Any) -> None:
    """The check above could pass with a mask that did nothing only if the environment's
    tokens did not move the loss; they do."""
    model = load_model()
    learner = Learner(spec=LearnerSpec(algorithm="dpo", params=bridge.TrainParams(),
                                       algorithm_params={"beta": 0.5}), model=model,
                      tokenizer=tokenizer, ref_model=load_model())
    masked, _ = _dpo_pairs(model)
    # A reference a step away from the policy: with policy == reference every log ratio is 0.
    assert learner.ref_model is not None
    with torch.no_grad():
        for p in learner.ref_model.parameters():
            p.add_(0.05 * torch.randn_like(p))
        loss, _ = learner.loss(TrainBatch(usual=masked))
        unmasked, _ = learner.loss(TrainBatch(usual=[Rollout(**{**r.__dict__, "action_mask": None}) for r in masked]))
    assert abs(float(loss) - float(unmasked)) > 1e-4


def test_a_mask_in_the_middle_of_a_turn_changes_the_loss_and_ignores_the_masked_logprobs(load_model: Any, tokenizer: Any) -> None:
    """Multi-turn: sampled, environment, sampled. The mask matters (the loss differs from the
    unmasked one) and what the environment wrote as logprobs for its tokens does not."""
    model = load_model()
    learner = Learner(spec=LearnerSpec(algorithm="grpo", params=bridge.TrainParams(),
                                       algorithm_params={"loss_type": "bnpo"}), model=model, tokenizer=tokenizer)
    masked, _ = _pair(model, seed=6)
    middle = [
        Rollout(id=r.id, group_id=r.group_id, prompt_ids=r.prompt_ids, completion_ids=[5, 6] + r.completion_ids + [7],
                logprobs=[-1.0, -1.0] + list(r.logprobs or []) + [-1.0], reward=r.reward,
                action_mask=[1, 1] + [0] * len(r.completion_ids) + [1])
        for r in masked
    ]
    with torch.no_grad():
        loss, _ = learner.loss(TrainBatch(usual=middle))
        placeholder = [
            Rollout(**{**r.__dict__, "logprobs": [lp if m else 50.0 for lp, m in zip(r.logprobs or [], r.trained_mask)]})
            for r in middle
        ]
        loss_placeholder, _ = learner.loss(TrainBatch(usual=placeholder))
        unmasked = [Rollout(**{**r.__dict__, "action_mask": None}) for r in middle]
        loss_unmasked, _ = learner.loss(TrainBatch(usual=unmasked))
    assert torch.isfinite(loss)
    torch.testing.assert_close(loss, loss_placeholder, atol=TOL, rtol=TOL)
    assert abs(float(loss) - float(loss_unmasked)) > 1e-3


@pytest.mark.parametrize("algorithm", ["grpo", "sft", "mix", "dpo"])
def test_an_all_zero_mask_trains_nothing(load_model: Any, tokenizer: Any, algorithm: str) -> None:
    model = load_model()
    masked, _ = _pair(model, expert=algorithm == "sft", seed=7)
    silent = [Rollout(**{**r.__dict__, "action_mask": [0] * len(r.completion_ids)}) for r in masked]
    batch = TrainBatch(expert=silent) if algorithm == "sft" else TrainBatch(
        usual=silent, expert=[Rollout(**{**r.__dict__, "is_expert": True}) for r in silent[:2]] if algorithm == "mix" else []
    )
    learner = Learner(
        spec=LearnerSpec(algorithm=algorithm, params=bridge.TrainParams(learning_rate=1e-2),
                         algorithm_params={"mu": 0.5} if algorithm == "mix" else None),
        model=model, tokenizer=tokenizer, ref_model=load_model() if algorithm == "dpo" else None,
    )
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    with pytest.raises(NothingToTrain):
        learner.step(batch)
    assert all(torch.equal(p.detach(), before[n]) for n, p in model.named_parameters())


def test_a_fully_masked_row_keeps_its_reward_in_the_group_baseline(load_model: Any, tokenizer: Any) -> None:
    """A truncated response the pipeline masked trains no token, but its group's advantages
    are those of the whole group: its tokens do not matter, its reward does."""
    model = load_model()
    learner = Learner(spec=LearnerSpec(algorithm="grpo", params=bridge.TrainParams(),
                                       algorithm_params={"loss_type": "grpo"}), model=model, tokenizer=tokenizer)
    _, rows = _pair(model, seed=8)
    cut = Rollout(**{**rows[0].__dict__, "action_mask": [0] * len(rows[0].completion_ids)})
    other_tokens = Rollout(**{**cut.__dict__, "completion_ids": [11] * 9, "logprobs": [0.0] * 9, "action_mask": [0] * 9})
    other_reward = Rollout(**{**cut.__dict__, "reward": 100.0})
    with torch.no_grad():
        base, _ = learner.loss(TrainBatch(usual=[cut, *rows[1:]]))
        same, _ = learner.loss(TrainBatch(usual=[other_tokens, *rows[1:]]))
        moved, _ = learner.loss(TrainBatch(usual=[other_reward, *rows[1:]]))
        unmasked, _ = learner.loss(TrainBatch(usual=rows))
    torch.testing.assert_close(base, same, atol=TOL, rtol=TOL)
    assert abs(float(base) - float(moved)) > 1e-3
    assert abs(float(base) - float(unmasked)) > 1e-4


def test_step_metrics_count_only_the_models_tokens(load_model: Any, tokenizer: Any) -> None:
    model = load_model()
    masked, removed = _pair(model, seed=9)
    learner = Learner(spec=LearnerSpec(algorithm="grpo", params=bridge.TrainParams()), model=model, tokenizer=tokenizer)
    metrics = learner.step(TrainBatch(usual=masked))
    assert metrics["action_tokens"] == sum(len(r.completion_ids) for r in removed)
    assert metrics["response_length"] == pytest.approx(sum(len(r.completion_ids) for r in removed) / len(removed))


class _Exp:
    """The fields of a buffer experience that `rollout_from_experience` reads."""

    def __init__(self, **fields: Any) -> None:
        defaults = {"pk": 1, "group_id": "g", "reward": 1.0, "is_expert": False, "model_version": 0, "logprobs": None,
                    "action_mask": None, "response_text": "", "task_id": None}
        self.__dict__.update({**defaults, **fields})


def test_rollouts_carry_the_experiences_action_mask() -> None:
    r = rollout_from_experience(_Exp(token_ids=[1, 2, 3, 4, 5], prompt_length=2, action_mask=[1, 0, 1]))
    assert r.completion_ids == [3, 4, 5] and r.action_mask == [1, 0, 1] and r.action_count == 2
    # A mask of the wrong length (refused by experience_write) trains nothing rather than a guess.
    bad = rollout_from_experience(_Exp(token_ids=[1, 2, 3, 4, 5], prompt_length=2, action_mask=[1, 1]))
    assert bad.action_count == 0


@pytest.mark.django_db
@pytest.mark.parametrize("clean", [True, False])
def test_the_pipelines_mask_on_truncated_responses_takes_them_out_of_the_loss(
    load_model: Any, tokenizer: Any, owner: Any, clean: bool
) -> None:
    """`clean` (truncated: mask) on claim: the claimed truncated row reaches the trainer with a
    zero mask, and whatever tokens it has no longer move the loss; without the operator they do."""
    from dataclasses import replace

    from apps.buffer.services import batch_claim, experience_write
    from tests.factories import experience_row, make_run, make_taskset

    run = make_run(owner=owner, taskset=make_taskset(owner=owner), name="masked",
                   pipeline={"on_write": [], "on_claim": [{"name": "clean"}] if clean else [], "on_import": []})
    rows = [experience_row(run, key=f"k{i}", group="g", reward=float(i), token_ids=[1, 2, 3, 10 + i, 20 + i, 30 + i, 40 + i],
                           finish_reason="length" if i == 0 else "stop")
            for i in range(4)]
    experience_write(experiences=rows)
    claimed = sorted(batch_claim(run=run, worker="trainer", size=4), key=lambda e: e.key)
    rollouts = [rollout_from_experience(e) for e in claimed]
    assert (rollouts[0].action_mask == [0, 0, 0, 0]) is clean

    # cispo scores the tokens' own logprobs (a clipped ratio alone would not show the tokens).
    learner = Learner(spec=LearnerSpec(algorithm="grpo", params=bridge.TrainParams(),
                                       algorithm_params={"loss_type": "cispo"}), model=load_model(), tokenizer=tokenizer)
    other = [replace(rollouts[0], completion_ids=[50, 51, 52, 53]), *rollouts[1:]]
    with torch.no_grad():
        loss, _ = learner.loss(TrainBatch(usual=rollouts))
        loss_other, _ = learner.loss(TrainBatch(usual=other))
    if clean:
        torch.testing.assert_close(loss, loss_other, atol=TOL, rtol=TOL)
    else:
        assert abs(float(loss) - float(loss_other)) > 1e-5
