"""Comparing two models' gradients and reading a completion's true logprobs: what the
algorithm tests and the action-mask tests check a loss against."""

from __future__ import annotations

from typing import Any

import torch

TOL = 1e-5


def grads(model: Any) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def assert_same_grads(ours: Any, theirs: Any, *, tol: float = TOL) -> None:
    a, b = grads(ours), grads(theirs)
    assert a.keys() == b.keys() and a
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=tol, rtol=tol, msg=lambda m: f"{name}: {m}")
    assert any(g.abs().sum() > 0 for g in a.values()), "the batch gave no gradient at all"


@torch.no_grad()
def true_logprobs(model: Any, prompt: list[int], completion: list[int]) -> list[float]:
    ids = torch.tensor([prompt + completion])
    logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1]
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(completion)[:, None])[:, 0].tolist()
