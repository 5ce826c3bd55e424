"""The feedback app's port to the workers: what people's feedback gives a trainer (DPO's
preferences among a batch, the batch's feedback metrics) and the reward-model worker (the
preference pairs, rater figures, the versions of the learned reward model and the scores
it stores). Workers hold a `RunView`; the rows stay here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from apps.buffer.models import Experience
from apps.feedback.raters import reliability as _reliability
from apps.feedback.reward_model import versions as _versions
from apps.feedback.reward_model.preferences import PairLabels, PairsRead, pair_is_heldout, pair_labels, prompt_is_heldout
from apps.feedback.reward_model.preferences import preference_pairs as _preference_pairs
from apps.feedback.reward_model.preferences import preference_pairs_read as _preference_pairs_read
from apps.feedback.raters.reliability import RaterFigures
from apps.feedback.selectors import batch_feedback_metrics
from apps.feedback.handout.queue import experiences_handed_out_unbiased as _unbiased
from apps.feedback.selectors import preferences_among as _preferences_among
from apps.rewards.models import RewardModel
from apps.rewards.pairs import PreferencePair
from apps.runs.ports import RunView, row

__all__ = [
    "PairLabels", "PairsRead", "PreferencePair", "RaterFigures", "batch_feedback_metrics", "experiences_handed_out_unbiased",
    "experiences_to_score", "gold_experience_ids", "pair_is_heldout", "pair_labels", "preference_pairs",
    "preference_pairs_read",
    "preferences_among", "prompt_is_heldout", "rated_experiences", "rater_figures", "rater_offsets", "rater_weights",
    "reward_model_due", "reward_model_latest",
    "reward_model_publish", "rm_scores_apply", "run_label_count",
]


def preferences_among(*, run: RunView, ids: list[int]) -> list[tuple[int, int]]:
    return _preferences_among(run=row(run), ids=ids)


def preference_pairs(
    *, run: RunView, include_late: bool = True, rater_weights: Mapping[int, float] | None = None,
    rater_offsets: Mapping[int, float] | None = None, exclude_experience_ids: set[int] | None = None,
) -> list[PreferencePair]:
    return _preference_pairs(run=row(run), include_late=include_late, rater_weights=rater_weights,
                             rater_offsets=rater_offsets, exclude_experience_ids=exclude_experience_ids)


def preference_pairs_read(
    *, run: RunView, rater_weights: Mapping[int, float] | None = None,
    rater_offsets: Mapping[int, float] | None = None, exclude_experience_ids: set[int] | None = None,
) -> PairsRead:
    return _preference_pairs_read(run=row(run), rater_weights=rater_weights, rater_offsets=rater_offsets,
                                  exclude_experience_ids=exclude_experience_ids)


def rater_figures(*, run: RunView, gold: dict[int, float] | None = None) -> list[RaterFigures]:
    return _reliability.rater_figures(run=row(run), gold=gold)


def rater_weights(*, run: RunView, figures: Iterable[RaterFigures] | None = None,
                  earned: bool = False) -> dict[int, float] | None:
    return _reliability.rater_weights(run=row(run), figures=figures, earned=earned)


def rater_offsets(*, run: RunView, figures: Iterable[RaterFigures] | None = None) -> dict[int, float] | None:
    return _reliability.rater_offsets(run=row(run), figures=figures)


def experiences_handed_out_unbiased(*, run: RunView) -> set[int]:
    return _unbiased(run=row(run))


def run_label_count(*, run: RunView) -> int:
    return _versions.run_label_count(run=row(run))


def gold_experience_ids(*, run: RunView) -> set[int]:
    return _versions.gold_experience_ids(run=row(run))


def reward_model_due(*, run: RunView) -> bool:
    return _versions.reward_model_due(run=row(run))


def reward_model_latest(*, run: RunView) -> RewardModel | None:
    return _versions.reward_model_latest(run=row(run))


def reward_model_publish(
    *, run: RunView, path: str, base: str, accuracy: float | None, pairs_train: int, pairs_heldout: int,
    labels: int, seconds: float, scale: float = 1.0, offset: float = 0.5, accuracy_random: float | None = None,
    pairs_random: int | None = None, pair_labels: PairLabels | None = None,
) -> RewardModel:
    return _versions.reward_model_publish(
        run=row(run), path=path, base=base, accuracy=accuracy, pairs_train=pairs_train, pairs_heldout=pairs_heldout,
        labels=labels, seconds=seconds, scale=scale, offset=offset, accuracy_random=accuracy_random,
        pairs_random=pairs_random, pair_labels=pair_labels)


def experiences_to_score(*, run: RunView, rm: RewardModel, limit: int) -> list[Experience]:
    return list(_versions.experiences_to_score(run=row(run), rm=rm, limit=limit))


def rm_scores_apply(*, run: RunView, rm: RewardModel, scores: Mapping[int, float],
                    spreads: Mapping[int, float] | None = None) -> int:
    return _versions.rm_scores_apply(run=row(run), rm=rm, scores=scores, spreads=spreads)


def rated_experiences(*, run: RunView, exclude: Iterable[int] = (), limit: int) -> list[tuple[str, str, float | None, str]]:
    """(prompt, response, human reward, group id) of the newest model experiences people
    rated, `exclude` left out (a reward model's calibration points)."""
    return list(Experience.objects.filter(run_id=run.id, human_reward__isnull=False, is_expert=False)
                .exclude(pk__in=list(exclude)).order_by("-id")
                .values_list("prompt_text", "response_text", "human_reward", "group_id")[:limit])
