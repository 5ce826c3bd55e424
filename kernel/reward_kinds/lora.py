"""`lora`: the run's own base fine-tuned with a LoRA adapter under a scalar score, on people's
pairs with the Bradley-Terry loss TRL's RewardTrainer minimises (workers/reward/kinds/lora.py).
It starts from `head`'s fit (a linear head on the frozen base's pooled hidden states, beside the
base's log-likelihood of the completion and of its answer) and then trains the head and the
adapter together: it can change what the base computes, not only weigh it. One fit, no
ensemble spread, no folds (each would be another fine-tuning); held-out accuracy on the
held-out share. A fit costs a few hundred forward and backward passes of the base."""

from __future__ import annotations

from kernel.reward_kinds import RewardKind, reward_kind_register


@reward_kind_register
class Lora(RewardKind):
    name = "lora"
    summary = "the run's own base fine-tuned with a LoRA adapter under a scalar head (Bradley-Terry)"
