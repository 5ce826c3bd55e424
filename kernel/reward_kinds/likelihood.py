"""`likelihood`: the base's token log-likelihoods of the completion (sum, mean, min, answer
span) weighed by a Bradley-Terry model fitted on the pairs (workers/reward/likelihood.py). It
learns how likely the base finds an answer, not a style."""

from __future__ import annotations

from kernel.reward_kinds import RewardKind, reward_kind_register


@reward_kind_register
class Likelihood(RewardKind):
    name = "likelihood"
    summary = "the base's log-likelihood statistics of the completion, weighed by a Bradley-Terry model"
    crossval = True
