"""The rewards app's port to the workers: scoring (the pure reward functions and their routing,
re-exported), the remote scoring of experiences (which ones wait, applying what a scorer
found), the run's current model for judges, and the K-12 grader's graded answers and
versions. Workers hold a `RunView`; the rows stay here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from apps.buffer.models import Experience
from apps.buffer.ports import ExperienceRecord
from apps.rewards.k12_rules import (
    GradedAnswer,
    K12JudgeParams,
    K12LearnedParams,
    grader_prompt,
    judge_params,
    k12_grade_pairs,
    learned_params,
    task_question,
)
from apps.rewards import rm_download as _rm_download
from apps.rewards import k12_rules as _k12
from apps.rewards.models import K12Grader, RewardModel
from apps.rewards.pairs import PreferencePair
from kernel.rewards import RewardResult, reference_text, task_field
from apps.rewards.scoring import reward_term_score, rewards_awaiting, rewards_for_domain, rewards_inline, task_domain
from apps.rewards.selectors import experiences_awaiting_rewards as _awaiting
from apps.rewards.verify import Verdict, answer_verdict
from apps.rewards.selectors import run_current_model as _current_model
from apps.rewards.services import experience_rewards_apply as _apply
from apps.rewards.services import rewards_remote_enqueue
from apps.runs.ports import DispatchHold, RunView, row

__all__ = [
    "Verdict", "answer_verdict", "ExperienceRecord", "GradedAnswer", "K12GraderRow", "K12JudgeParams", "K12LearnedParams", "PreferencePair", "RewardResult", "experience_rewards_apply",
    "experiences_awaiting_rewards", "grader_prompt", "judge_params", "k12_grade_pairs", "k12_graded_answers",
    "k12_grader_due", "k12_grader_latest", "k12_grader_publish", "learned_params", "reference_text",
    "reward_term_score", "rewards_awaiting", "rewards_for_domain", "rewards_inline", "rewards_remote_enqueue", "RewardModelRow", "reward_model_export_begin", "reward_model_get",
    "run_current_model", "task_domain", "task_field", "task_question",
]


# The type of the reward-model version rows the ports hand out. Workers read them and hand
# them back to the ports, never save or query through them (tests/test_layers.py checks
# that no module in workers/ uses a model manager).
RewardModelRow = RewardModel
# The same for the K-12 grader's versions.
K12GraderRow = K12Grader


def run_current_model(*, run: RunView) -> str:
    """The checkpoint of the run's current version; version 0 is the config's model."""
    return _current_model(run=row(run))


def experiences_awaiting_rewards(*, run: RunView, ids: Sequence[int]) -> list[Experience]:
    return _awaiting(run=row(run), ids=ids)


def experience_rewards_apply(
    *, run: RunView, scored: Mapping[int, Mapping[str, float]], errors: Mapping[int, Mapping[str, str]] | None = None,
    reasons: Mapping[int, Mapping[str, str]] | None = None,
) -> list[int]:
    return _apply(run=row(run), scored=scored, errors=errors, reasons=reasons)


def k12_graded_answers(*, run: RunView) -> list[GradedAnswer]:
    return _k12.k12_graded_answers(run=row(run))


def k12_grader_latest(*, run: RunView) -> K12Grader | None:
    return _k12.k12_grader_latest(run=row(run))


def k12_grader_due(*, run: RunView, params: K12LearnedParams, grades: int | None = None) -> bool:
    return _k12.k12_grader_due(run=row(run), params=params, grades=grades)


def k12_grader_publish(
    *, run: RunView, path: str, base: str, accuracy: float | None, pairs_train: int, pairs_heldout: int, grades: int,
    seconds: float, scale: float, offset: float,
) -> K12Grader:
    return _k12.k12_grader_publish(run=row(run), path=path, base=base, accuracy=accuracy, pairs_train=pairs_train,
                                   pairs_heldout=pairs_heldout, grades=grades, seconds=seconds, scale=scale,
                                   offset=offset)


def reward_model_get(rm_id: int) -> RewardModel | None:
    """A reward-model version by id (its path, scale and offset, for an export)."""
    return RewardModel.objects.filter(pk=rm_id).first()


def reward_model_export_begin(*, rm: RewardModel, task_id: str | None) -> tuple[Path, DispatchHold | None]:
    """(where the version's zip goes, the hold on its export dispatch or None: another has it)."""
    return _rm_download.export_zip_path(rm), _rm_download.export_begin(rm=rm, task_id=task_id)
