"""Our GRPO, DPO, SFT and MIX against TRL's own trainers on fixed batches.

The oracle in each test is TRL's whole pipeline (GRPO: its rollout hook, reward functions
and advantage computation; DPO and SFT: its dataset tokenisation and data loader), so what
is compared is everything we build around `compute_loss`: advantages, padding, masks,
π_old, token counts, pairs.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from workers.algorithms import (
    Learner,
    LearnerSpec,
    Rollout,
    TrainBatch,
    group_advantages,
    preference_pairs,
)
from tests.trainer.gradients import TOL, assert_same_grads, true_logprobs
from workers.algorithms import trl_bridge as bridge
from workers.algorithms.objectives import dpo, grpo, sft

from kernel.algorithms.dpo import DPOParams
from kernel.algorithms.grpo import GRPOParams

pytestmark = pytest.mark.slow



def _grpo_rollouts(model: Any, *, groups: int = 2, size: int = 4, seed: int = 0) -> list[Rollout]:
    """Variable-length completions; stored logprobs near the model's own so that some
    ratios fall inside the clip range and some outside."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for gi in range(groups):
        prompt = torch.randint(10, 200, (3 + gi,), generator=g).tolist()
        for j in range(size):
            completion = torch.randint(10, 200, (2 + (j * 3 + gi) % 5,), generator=g).tolist()
            true = true_logprobs(model, prompt, completion)
            noise = (torch.rand(len(true), generator=g) - 0.5) * 0.8
            rows.append(
                Rollout(
                    id=gi * size + j, group_id=f"g{gi}", prompt_ids=prompt, completion_ids=completion,
                    logprobs=[t + float(n) for t, n in zip(true, noise)], reward=float((j * 7 + gi) % 3),
                )
            )
    return rows


def _trl_grpo_oracle(*, model: Any, tokenizer: Any, params: bridge.TrainParams, settings: GRPOParams, rollouts: list[Rollout],
                     size: int) -> torch.Tensor:
    """TRL's GRPOTrainer from prompts to loss: its rollout hook returns our completions and
    logprobs, its reward function our rewards; it computes advantages itself."""

    def rollout_func(prompts: list[Any], trainer: Any) -> dict[str, Any]:
        return {
            "prompt_ids": [r.prompt_ids for r in rollouts],
            "completion_ids": [r.completion_ids for r in rollouts],
            "logprobs": [r.logprobs for r in rollouts],
            "stored_reward": [r.reward for r in rollouts],
        }

    def reward(completions: list[Any], stored_reward: list[float], **_: Any) -> list[float]:
        return list(stored_reward)

    trainer = grpo.trainer_build(
        model=model, tokenizer=tokenizer, params=params, settings=settings, num_generations=size, batch_size=len(rollouts),
        rollout_func=rollout_func, reward_funcs=[reward],
    )
    # TRL's own pipeline from prompts to the loss inputs (its rollout_func and reward
    # function above decide completions and rewards).
    inputs = trainer._generate_and_score_completions([{"prompt": f"p{r.group_id}"} for r in rollouts])
    # TRL keeps rollout logprobs as `sampling_per_token_logps`; for a buffer-fed trainer they
    # are π_old (DESIGN: ratio and clipping against the behaviour policy).
    inputs["old_per_token_logps"] = inputs.pop("sampling_per_token_logps")
    return trainer.compute_loss(model, inputs)


@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "dr_grpo", "bnpo", "cispo", "sapo", "luspo", "vespo"])
def test_grpo_loss_and_gradients_equal_trls_own_grpo_trainer(load_model: Any, tokenizer: Any, loss_type: str) -> None:
    params = bridge.TrainParams(max_completion_length=8)
    settings = GRPOParams(loss_type=loss_type, epsilon_high=0.28 if loss_type == "dapo" else None)
    theirs_model, ours_model = load_model(), load_model()
    rollouts = _grpo_rollouts(ours_model)
    theirs = _trl_grpo_oracle(model=theirs_model, tokenizer=tokenizer, params=params, settings=settings, rollouts=rollouts,
                              size=4)
    theirs.backward()

    learner = Learner(spec=LearnerSpec(algorithm="grpo", params=params, algorithm_params=settings), model=ours_model,
                      tokenizer=tokenizer)
    ours, metrics = learner.loss(TrainBatch(usual=rollouts))
    ours.backward()

    torch.testing.assert_close(ours, theirs, atol=TOL, rtol=TOL)
    assert_same_grads(ours_model, theirs_model)
    assert metrics["entropy"] > 0


def test_grpo_with_kl_to_the_reference_equals_trl(load_model: Any, tokenizer: Any) -> None:
    params = bridge.TrainParams(max_completion_length=8)
    settings = GRPOParams(loss_type="grpo", beta=0.04)
    theirs_model, ours_model = load_model(), load_model()
    rollouts = _grpo_rollouts(ours_model, seed=3)
    # Move the policy away from the reference so that the KL term is not zero.
    noise = torch.randn(theirs_model.lm_head.weight.shape, generator=torch.Generator().manual_seed(1)) * 0.5
    with torch.no_grad():
        for m in (theirs_model, ours_model):
            m.lm_head.weight.add_(noise)
    theirs = _trl_grpo_oracle(model=theirs_model, tokenizer=tokenizer, params=params, settings=settings, rollouts=rollouts,
                              size=4)
    theirs.backward()
    learner = Learner(
        spec=LearnerSpec(algorithm="grpo", params=params, algorithm_params=settings), model=ours_model, tokenizer=tokenizer, ref_model=load_model()
    )
    ours, metrics = learner.loss(TrainBatch(usual=rollouts))
    ours.backward()
    torch.testing.assert_close(ours, theirs, atol=TOL, rtol=TOL)
    assert_same_grads(ours_model, theirs_model)
    assert metrics["kl"] > 0


def test_group_advantages_are_normalised_within_each_group() -> None:
    rows = [Rollout(id=i, group_id=g, prompt_ids=[1], completion_ids=[2], reward=r)
            for i, (g, r) in enumerate([("a", 0.0), ("a", 1.0), ("b", 5.0), ("b", 5.0), ("b", None)])]
    adv = group_advantages(rows, scale="group")
    assert adv[0] < 0 < adv[1] and abs(float(adv[0] + adv[1])) < 1e-6
    assert adv[2:].tolist() == [0.0, 0.0, 0.0]


def _texts() -> list[dict[str, str]]:
    return [
        {"prompt": "What is 3 + 4?", "chosen": " <answer>7</answer>", "rejected": " <answer>9</answer>"},
        {"prompt": "What is 10 + 2?", "chosen": " <answer>12</answer>", "rejected": " 13"},
        {"prompt": "What is 1 + 1?", "chosen": " <answer>2</answer>", "rejected": " <answer>11</answer> and more"},
    ]


def test_dpo_loss_and_gradients_equal_trls_dpo_trainer(load_model: Any, tokenizer: Any) -> None:
    from datasets import Dataset

    params, settings = bridge.TrainParams(), DPOParams(beta=0.1)
    theirs_model, ours_model = load_model(), load_model()
    # Both sides' policy moved off the reference, else every log-ratio is zero.
    with torch.no_grad():
        for m in (theirs_model, ours_model):
            m.lm_head.weight.mul_(1.3)
    dataset = Dataset.from_list(_texts())
    trl_trainer = dpo.trainer_build(
        model=theirs_model, ref_model=load_model(), tokenizer=tokenizer, params=params, settings=settings, train_dataset=dataset,
        batch_size=len(dataset),
    )
    batch = next(iter(trl_trainer.get_train_dataloader()))
    theirs = trl_trainer.compute_loss(theirs_model, batch)
    theirs.backward()

    # Our side starts from the buffer: each prompt's two answers as a group of rollouts with
    # rewards, tokenised as TRL tokenised them.
    rollouts = []
    for i, row in enumerate(trl_trainer.train_dataset):
        rollouts.append(Rollout(id=2 * i, group_id=f"g{i}", prompt_ids=row["prompt_ids"], completion_ids=row["chosen_ids"], reward=1.0))
        rollouts.append(Rollout(id=2 * i + 1, group_id=f"g{i}", prompt_ids=row["prompt_ids"], completion_ids=row["rejected_ids"], reward=0.0))
    learner = Learner(spec=LearnerSpec(algorithm="dpo", params=params, algorithm_params=settings), model=ours_model,
                      tokenizer=tokenizer, ref_model=load_model())
    ours, metrics = learner.loss(TrainBatch(usual=rollouts))
    ours.backward()
    torch.testing.assert_close(ours, theirs, atol=TOL, rtol=TOL)
    assert_same_grads(ours_model, theirs_model)
    assert metrics["pairs"] == 3


def test_preference_pairs_come_from_feedback_first_then_best_against_worst() -> None:
    p = [1, 2]
    rows = [
        Rollout(id=1, group_id="a", prompt_ids=p, completion_ids=[3], reward=0.2),
        Rollout(id=2, group_id="a", prompt_ids=p, completion_ids=[4], reward=0.9),
        Rollout(id=3, group_id="a", prompt_ids=p, completion_ids=[5], reward=0.5),
        Rollout(id=4, group_id="b", prompt_ids=[7], completion_ids=[3], reward=0.0),
        Rollout(id=5, group_id="b", prompt_ids=[7], completion_ids=[4], reward=1.0),
        Rollout(id=6, group_id="c", prompt_ids=[8], completion_ids=[4], reward=1.0),
        Rollout(id=7, group_id="c", prompt_ids=[8], completion_ids=[5], reward=1.0),
    ]
    pairs = preference_pairs(rows, preferences=[(1, 3)])
    assert [(c.id, r.id) for c, r in pairs] == [(1, 3), (5, 4)]


def test_sft_loss_and_gradients_equal_trls_sft_trainer(load_model: Any, tokenizer: Any) -> None:
    from datasets import Dataset

    params = bridge.TrainParams()
    theirs_model, ours_model = load_model(), load_model()
    dataset = Dataset.from_list([{"prompt": t["prompt"], "completion": t["chosen"]} for t in _texts()])
    trl_trainer = sft.trainer_build(
        model=theirs_model, tokenizer=tokenizer, params=params, train_dataset=dataset, batch_size=len(dataset)
    )
    batch = next(iter(trl_trainer.get_train_dataloader()))
    theirs = trl_trainer.compute_loss(theirs_model, batch)
    theirs.backward()

    rollouts = []
    for i, row in enumerate(trl_trainer.train_dataset):
        cut = next(k for k, label in enumerate(row["labels"]) if label != -100)
        rollouts.append(Rollout(id=i, group_id=f"e{i}", prompt_ids=row["input_ids"][:cut], completion_ids=row["input_ids"][cut:], is_expert=True))
    learner = Learner(spec=LearnerSpec(algorithm="sft", params=params), model=ours_model, tokenizer=tokenizer)
    ours, _ = learner.loss(TrainBatch(expert=rollouts))
    ours.backward()
    torch.testing.assert_close(ours, theirs, atol=TOL, rtol=TOL)
    assert_same_grads(ours_model, theirs_model)


def _mix_batch(model: Any) -> TrainBatch:
    usual = _grpo_rollouts(model, seed=5)
    expert = [
        Rollout(id=100 + i, group_id=f"x{i}", prompt_ids=r.prompt_ids, completion_ids=r.completion_ids[::-1], is_expert=True)
        for i, r in enumerate(usual[::3])
    ]
    return TrainBatch(usual=usual, expert=expert)


@pytest.mark.parametrize("mu,alone", [(0.0, "grpo"), (1.0, "sft")])
def test_mix_at_the_ends_of_mu_equals_grpo_or_sft(load_model: Any, tokenizer: Any, mu: float, alone: str) -> None:
    params = bridge.TrainParams(max_completion_length=8)
    mix_model, alone_model = load_model(), load_model()
    batch = _mix_batch(mix_model)
    mix = Learner(spec=LearnerSpec(algorithm="mix", params=params, algorithm_params={"loss_type": "grpo", "mu": mu}),
                  model=mix_model, tokenizer=tokenizer)
    single = Learner(spec=LearnerSpec(algorithm=alone, params=params,
                                      algorithm_params={"loss_type": "grpo"} if alone == "grpo" else None),
                     model=alone_model, tokenizer=tokenizer)
    mix_loss, _ = mix.loss(batch)
    single_loss, _ = single.loss(TrainBatch(usual=batch.usual) if alone == "grpo" else TrainBatch(expert=batch.expert))
    mix_loss.backward()
    single_loss.backward()
    torch.testing.assert_close(mix_loss, single_loss, atol=TOL, rtol=TOL)
    assert_same_grads(mix_model, alone_model)


def test_mix_in_between_weighs_both_losses(load_model: Any, tokenizer: Any) -> None:
    params = bridge.TrainParams(max_completion_length=8)
    model = load_model()
    batch = _mix_batch(model)
    learner = Learner(spec=LearnerSpec(algorithm="mix", params=params, algorithm_params={"loss_type": "grpo", "mu": 0.3}),
                      model=model, tokenizer=tokenizer)
    loss, metrics = learner.loss(batch)
    assert float(loss) == pytest.approx(0.7 * metrics["grpo_loss"] + 0.3 * metrics["sft_loss"], abs=1e-5)


@pytest.mark.parametrize("algorithm", ["grpo", "dpo", "sft", "mix"])
def test_one_step_of_each_algorithm_changes_the_weights(load_model: Any, tokenizer: Any, algorithm: str) -> None:
    model = load_model()
    batch = _mix_batch(model)
    if algorithm == "sft":
        batch = TrainBatch(expert=batch.expert)
    learner = Learner(
        spec=LearnerSpec(algorithm=algorithm, params=bridge.TrainParams(learning_rate=1e-3, max_completion_length=8),
                         algorithm_params={"mu": 0.5} if algorithm == "mix" else None),
        model=model, tokenizer=tokenizer, ref_model=load_model() if algorithm == "dpo" else None,
    )
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    metrics = learner.step(batch)
    changed = [n for n, p in model.named_parameters() if not torch.equal(p.detach(), before[n])]
    assert changed, f"{algorithm}: no parameter moved"
    assert metrics["loss"] == metrics["loss"] and metrics["grad_norm"] > 0


@pytest.fixture
def trl_tiles() -> Any:
    """TRL's fused-head tile sizes as they were, after the test (they are process-wide)."""
    before = bridge.fused_head_tiles(tokens=4096, vocab=32768)
    bridge.fused_head_tiles(tokens=before[0], vocab=before[1])
    yield
    bridge.fused_head_tiles(tokens=before[0], vocab=before[1])


def test_small_logprob_tiles_leave_the_grpo_loss_kl_and_gradients_as_one_tile_gives(
    load_model: Any, tokenizer: Any, trl_tiles: Any
) -> None:
    """The CPU learner scores tokens in small tiles (trl_bridge.CPU_HEAD_*) to keep its peak
    memory down; tiles of 4 tokens × 32 vocabulary columns, which split every row and the
    300-token vocabulary, give the loss, KL and gradients of one whole tile."""
    params = bridge.TrainParams(max_completion_length=8)
    results = []
    for tokens, vocab in ((4096, 32768), (4, 32)):
        model = load_model()
        with torch.no_grad():
            model.lm_head.weight.add_(torch.randn(model.lm_head.weight.shape,
                                                  generator=torch.Generator().manual_seed(1)) * 0.5)
        learner = Learner(spec=LearnerSpec(algorithm="grpo", params=params, algorithm_params={"loss_type": "grpo", "beta": 0.04}),
                          model=model, tokenizer=tokenizer, ref_model=load_model())
        # After the learner, which sets the CPU tiles.
        bridge.fused_head_tiles(tokens=tokens, vocab=vocab)
        loss, metrics = learner.loss(TrainBatch(usual=_grpo_rollouts(model, seed=3)))
        loss.backward()
        results.append((model, loss.detach(), metrics))
    (whole, whole_loss, whole_metrics), (tiled, tiled_loss, tiled_metrics) = results
    assert tokenizer.vocab_size > 32 * 4
    torch.testing.assert_close(tiled_loss, whole_loss, atol=TOL, rtol=TOL)
    assert tiled_metrics["kl"] == pytest.approx(whole_metrics["kl"], rel=1e-5) and whole_metrics["kl"] > 0
    assert tiled_metrics["entropy"] == pytest.approx(whole_metrics["entropy"], rel=1e-5)
    # The tiles add the same float32 terms in another order, and the embedding's gradient
    # gathers every token's: 12 of its 9,600 entries were once 4e-5 apart (CI-like load).
    assert_same_grads(tiled, whole, tol=2e-4)


def test_a_cpu_learner_scores_in_small_tiles(load_model: Any, tokenizer: Any, trl_tiles: Any) -> None:
    from trl.kernels import chunked_logprob
    from trl.trainer import utils

    bridge.fused_head_tiles(tokens=4096, vocab=32768)
    Learner(spec=LearnerSpec(algorithm="grpo"), model=load_model(), tokenizer=tokenizer)
    assert (chunked_logprob.TOKEN_CHUNK_SIZE, utils._CHUNKED_LOGPROB_CHUNK_SIZE) == (
        bridge.CPU_HEAD_TOKENS, bridge.CPU_HEAD_VOCAB)
