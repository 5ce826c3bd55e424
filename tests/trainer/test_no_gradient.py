"""A batch without gradient leaves the policy exactly as it was.

GRPO's loss is each token's term times its advantage; when every group's members got the
same reward every advantage is 0 and so is the gradient. AdamW would still move the weights
(its momentum replays the previous steps' gradients), so the learner skips the update and
says so in `train/skipped_no_signal`. Each test first takes a real step, so the optimizer
has momentum to replay: without the skip the tied batch moves the weights.
"""

from __future__ import annotations

from typing import Any

import torch

from workers.algorithms import Learner, LearnerSpec, Rollout, TrainBatch, group_advantages
from workers.algorithms import trl_bridge as bridge
from workers.algorithms.learner import SKIPPED_NO_GRADIENT


def _rollouts(*, tied: bool, groups: int = 2, size: int = 6, start: int = 0) -> list[Rollout]:
    g = torch.Generator().manual_seed(start)
    rows = []
    for gi in range(groups):
        prompt = torch.randint(10, 200, (3,), generator=g).tolist()
        for j in range(size):
            completion = torch.randint(10, 200, (2 + j % 3,), generator=g).tolist()
            # tied: each group's members alike, at values float32 cannot hold exactly (the mean of
            # six 0.3s is an ulp off 0.3: the advantages' rounding dust must not count).
            reward = (0.3 if gi % 2 else 1.2) if tied else float(j % 2)
            rows.append(Rollout(id=start + gi * size + j, group_id=f"g{start}-{gi}", prompt_ids=prompt,
                                completion_ids=completion, reward=reward))
    return rows


def _expert(start: int) -> list[Rollout]:
    return [Rollout(id=start + i, group_id=f"x{start}-{i}", prompt_ids=[11, 12, 13], completion_ids=[20 + i, 30, 40],
                    is_expert=True) for i in range(2)]


def _learner(load_model: Any, tokenizer: Any, *, algorithm: str = "grpo", beta: float = 0.0) -> Learner:
    params = bridge.TrainParams(learning_rate=1e-2, max_completion_length=8)
    settings: dict[str, object] | None = {"loss_type": "grpo", "beta": beta} if algorithm in ("grpo", "mix") else None
    if algorithm == "mix":
        settings = {**(settings or {}), "mu": 0.5}
    return Learner(spec=LearnerSpec(algorithm=algorithm, params=params, algorithm_params=settings), model=load_model(),
                   tokenizer=tokenizer, ref_model=load_model() if beta > 0 else None)


def _state(learner: Learner) -> tuple[dict[str, torch.Tensor], Any]:
    weights = {n: p.detach().clone() for n, p in learner.model.named_parameters()}
    return weights, learner.optimizer.state_dict()


def _moved(learner: Learner, before: dict[str, torch.Tensor]) -> list[str]:
    return [n for n, p in learner.model.named_parameters() if not torch.equal(p.detach(), before[n])]


def test_a_group_rewarded_alike_has_advantages_of_exactly_zero() -> None:
    rows = _rollouts(tied=True) + _rollouts(tied=False, start=50)
    for scale in ("group", "batch", "none"):
        advantages = group_advantages(rows, scale=scale)
        assert torch.count_nonzero(advantages[:12]) == 0, scale
        assert torch.count_nonzero(advantages[12:]) == 12, scale  # 0/1 rewards: every member off the mean


def test_a_grpo_batch_whose_groups_are_all_tied_leaves_weights_and_optimizer_bit_identical(
    load_model: Any, tokenizer: Any,
) -> None:
    learner = _learner(load_model, tokenizer)
    first = learner.step(TrainBatch(usual=_rollouts(tied=False)))
    assert first[SKIPPED_NO_GRADIENT] == 0.0
    weights, opt = _state(learner)
    steps_before = [s["step"].clone() for s in opt["state"].values()]

    metrics = learner.step(TrainBatch(usual=_rollouts(tied=True, start=100)))

    assert _moved(learner, weights) == []
    assert metrics[SKIPPED_NO_GRADIENT] == 1.0
    # The optimizer's moments and step counts are untouched too: the next real step is the
    # step it would have been had the tied batch never come.
    after = learner.optimizer.state_dict()
    assert [s["step"] for s in after["state"].values()] == steps_before
    for key, state in opt["state"].items():
        assert torch.equal(state["exp_avg"], after["state"][key]["exp_avg"])
    # What the batch was is still reported (the run page shows its rewards), no loss.
    assert metrics["batch_size"] == 12.0 and "reward_mean" in metrics and "loss" not in metrics


def test_a_grpo_batch_with_one_untied_group_still_updates(load_model: Any, tokenizer: Any) -> None:
    learner = _learner(load_model, tokenizer)
    learner.step(TrainBatch(usual=_rollouts(tied=False)))
    weights, _ = _state(learner)
    rows = _rollouts(tied=True, start=100)
    rows[0] = Rollout(**{**rows[0].__dict__, "reward": 5.0})  # one member of one group differs

    metrics = learner.step(TrainBatch(usual=rows))

    assert metrics[SKIPPED_NO_GRADIENT] == 0.0
    assert _moved(learner, weights)


def test_with_a_kl_penalty_a_tied_batch_still_updates(load_model: Any, tokenizer: Any) -> None:
    # beta > 0: the KL term pulls the policy back to the reference whatever the advantages.
    learner = _learner(load_model, tokenizer, beta=0.5)
    learner.step(TrainBatch(usual=_rollouts(tied=False)))
    weights, _ = _state(learner)

    metrics = learner.step(TrainBatch(usual=_rollouts(tied=True, start=100)))

    assert metrics[SKIPPED_NO_GRADIENT] == 0.0
    assert _moved(learner, weights)


def test_mix_skips_a_tied_batch_without_experts_and_trains_one_with_them(load_model: Any, tokenizer: Any) -> None:
    learner = _learner(load_model, tokenizer, algorithm="mix")
    learner.step(TrainBatch(usual=_rollouts(tied=False), expert=_expert(50)))
    weights, _ = _state(learner)

    skipped = learner.step(TrainBatch(usual=_rollouts(tied=True, start=100)))
    assert _moved(learner, weights) == []
    assert skipped[SKIPPED_NO_GRADIENT] == 1.0

    # The SFT part of a MIX batch is signal of its own, tied usual rows or not.
    trained = learner.step(TrainBatch(usual=_rollouts(tied=True, start=200), expert=_expert(300)))
    assert trained[SKIPPED_NO_GRADIENT] == 0.0
    assert _moved(learner, weights)
