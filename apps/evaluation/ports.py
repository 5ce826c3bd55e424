"""The evaluation app's port to the workers (workers/explore/blind.py): the answers an evaluation
still needs, recording one, and opening the evaluation once none is missing. Nothing else
of the app is reachable from workers/ (pyproject.toml: "workers reach the apps through their
ports")."""

from __future__ import annotations

from apps.evaluation import services
from apps.evaluation.models import Evaluation
from apps.evaluation.services import AnswerNeed

__all__ = ["AnswerNeed", "answer_record", "answers_needed", "evaluation_failed", "evaluation_open"]


def answers_needed(*, evaluation_id: int) -> list[AnswerNeed] | None:
    """The answers evaluation `evaluation_id` lacks; None when there is no such evaluation
    or it is no longer waiting for answers."""
    evaluation = Evaluation.objects.filter(pk=evaluation_id, status=Evaluation.Status.GENERATING).first()
    return None if evaluation is None else services.answers_missing(evaluation=evaluation)


def answer_record(*, need: AnswerNeed, text: str) -> None:
    services.answer_record(run_id=need.run_id, version=need.version, digest=need.digest, seed=need.seed, text=text)


def evaluation_open(*, evaluation_id: int) -> bool:
    return services.evaluation_open(evaluation_id=evaluation_id)


def evaluation_failed(*, evaluation_id: int, error: str) -> None:
    services.evaluation_failed(evaluation_id=evaluation_id, error=error)
