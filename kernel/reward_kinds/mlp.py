"""`mlp`: an ensemble of small two-layer networks on the pooled hidden states of every layer
of the run's own model (its base or current policy), the base frozen, trained on people's
pairs with a Bradley-Terry loss (workers/reward/kinds/mlp.py). It reads more than `head`
(every layer, not only the embeddings and the last) and can learn what a linear head
cannot: a preference for one of two things but not both, a style only on right answers.
Like `head`, an ensemble on bootstrap samples (its spread is the selection rule's
uncertainty) and held-out accuracy by cross-validation over prompts."""

from __future__ import annotations

from kernel.reward_kinds import RewardKind, reward_kind_register


@reward_kind_register
class Mlp(RewardKind):
    name = "mlp"
    summary = "an ensemble of small networks on every layer's pooled hidden states of the run's own model"
    spread = True
    crossval = True
