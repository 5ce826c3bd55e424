"""`head`, the default: small scalar heads on the pooled hidden states of the run's own
model (its base or current policy), trained on people's pairs with a Bradley-Terry loss.
An ensemble of heads, each on a bootstrap sample of the pairs: their mean is the score,
their spread the uncertainty the selection rule reads. Works from tens of labels (the base
stays frozen; only a few thousand weights are fitted). With `crossval_folds`, each fold of
prompts gets its own ensemble fitted without it, and the held-out accuracy is out of fold."""

from __future__ import annotations

from kernel.reward_kinds import RewardKind, reward_kind_register


@reward_kind_register
class Head(RewardKind):
    name = "head"
    summary = "an ensemble of scalar heads on the run's own model's hidden states (Bradley-Terry)"
    spread = True
    crossval = True
