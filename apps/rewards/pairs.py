"""The pair a reward model trains on: one text preferred over another for the same prompt.
Built from human feedback (apps.feedback.reward_model.preferences) and from graded answers
(apps.rewards.k12_rules.k12_grade_pairs); read by the reward-model trainers in workers/."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PreferencePair:
    prompt: str
    chosen: str
    rejected: str
    chosen_id: int
    rejected_id: int
    group_id: str
    kind: str  # the feedback kind it came from
    # How much more the chosen is preferred, on the human scale [0, 1] (1.0 for a choice).
    margin: float
    # How far the pair's raters are trusted, [TRUSTED_WEIGHT, 1] (1 without rater weighting):
    # a choice, ranking or edit its author's reliability weight; a rating pair the lesser of
    # its two sides' (each side the summed weight of the raters who rated it, capped at 1).
    # The reward model weighs its training pairs and its held-out accuracy by it.
    trust: float = 1.0
    # The labels (feedback row ids) it came from: a rating pair the ratings of both of its
    # members that entered their human rewards; a ranking, A/B choice or edit pair its one row.
    # What a reward-model version records it trained on (RewardModel.trained_on); empty for a
    # pair made from no label (a graded answer's).
    feedback_ids: tuple[int, ...] = ()
