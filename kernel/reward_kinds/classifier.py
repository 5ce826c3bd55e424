"""`classifier`: a scalar-head sequence classifier, the whole network trained with TRL's
RewardTrainer (saved where `AutoModelForSequenceClassification` loads it). Worth it with
many labels, or over a separately trained judge (`reward_model.base`)."""

from __future__ import annotations

from kernel.reward_kinds import RewardKind, reward_kind_register


@reward_kind_register
class Classifier(RewardKind):
    name = "classifier"
    summary = "a sequence classifier trained whole with TRL's RewardTrainer"
    warm_start = True
