"""Blind evaluations ready to vote on, without workers: the answers a worker would write
are recorded through the port (apps/evaluation/ports.py) with made-up texts."""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import pytest
from django.contrib.auth.models import User

from apps.evaluation.models import Evaluation
from apps.evaluation.ports import answer_record, answers_needed, evaluation_open
from apps.evaluation.services import VersionRef, evaluation_create
from apps.runs.models import ModelVersion, Run


def publish(run: Run, *numbers: int) -> Run:
    for n in numbers:
        ModelVersion.objects.create(run=run, number=n, checkpoint=f"/nowhere/v{n}", train_step=n * 10)
    Run.objects.filter(pk=run.pk).update(current_version=max(numbers))
    run.refresh_from_db()
    return run


def answer_all(evaluation: Evaluation, text: Callable[[int, int, str], str] | None = None) -> Evaluation:
    """Write every missing answer as a worker would, then open the evaluation."""
    for need in answers_needed(evaluation_id=evaluation.pk) or []:
        # The default texts differ by version without naming it (the page tests look for leaks).
        tag = hashlib.sha256(f"{need.run_id}/{need.version}/{need.text}".encode()).hexdigest()[:8]
        answer_record(need=need, text=text(need.run_id, need.version, need.text) if text
                      else f"answer {tag} to {need.text}")
    assert evaluation_open(evaluation_id=evaluation.pk)
    evaluation.refresh_from_db()
    return evaluation


MakeEvaluation = Callable[..., Evaluation]


@pytest.fixture
def make_evaluation(run: Run, owner: User) -> MakeEvaluation:
    publish(run, 1, 2)

    def make(*, versions: list[int] | None = None, prompts: int = 10, votes_per_pair: int = 1,
             voters: list[str] | None = None, seed: int = 7) -> Evaluation:
        evaluation = evaluation_create(
            run=run, by=owner, versions=[VersionRef(number=n) for n in versions] if versions else None,
            prompts=[f"prompt {i}" for i in range(prompts)], prompt_count=prompts, votes_per_pair=votes_per_pair,
            voters=voters, seed=seed)
        return answer_all(evaluation)

    return make
