"""The workers write a blind evaluation's answers with the tiny demo model through the run's own
engine path (workers/explore/blind.py, the task called as Celery runs it), cache them by version,
prompt and seed, and open the evaluation; asking for one enqueues the task on commit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User

from apps.evaluation.models import Answer, Evaluation
from apps.evaluation.services import ANSWERS_TASK, evaluation_create
from apps.runs.models import ModelVersion, Run, WeightLoad
from rftweb.celery import app
from tests.factories import make_run

pytestmark = pytest.mark.django_db


def _run(owner: User, demo_model_dir: Path) -> Run:
    run = make_run(owner=owner, model=str(demo_model_dir),
                   eval={"sampling": {"temperature": 1.0, "max_tokens": 6}})
    ModelVersion.objects.create(run=run, number=1, checkpoint=str(demo_model_dir), train_step=1)
    Run.objects.filter(pk=run.pk).update(current_version=1)
    run.refresh_from_db()
    return run


def test_asking_enqueues_the_answers_on_commit_on_the_rollout_queue(owner: User, run: Run, monkeypatch: pytest.MonkeyPatch,
                                                                    django_capture_on_commit_callbacks: Any) -> None:
    ModelVersion.objects.create(run=run, number=1, checkpoint="/x", train_step=1)
    Run.objects.filter(pk=run.pk).update(current_version=1)
    run.refresh_from_db()
    sent: list[tuple[str, list[object]]] = []
    monkeypatch.setattr(app, "send_task", lambda name, args: sent.append((name, args)))
    with django_capture_on_commit_callbacks(execute=True):
        evaluation = evaluation_create(run=run, by=owner, prompts=["p"])
        assert sent == []  # not before the rows are committed
    assert sent == [(ANSWERS_TASK, [evaluation.pk])]
    assert app.amqp.router.route({}, ANSWERS_TASK)["queue"].name == "rollout"


@pytest.mark.slow
def test_the_demo_model_answers_once_per_version_prompt_and_seed(owner: User, demo_model_dir: Path) -> None:
    from workers.explore.blind import answers_generate

    run = _run(owner, demo_model_dir)
    first = evaluation_create(run=run, by=owner, prompts=["What is 2 + 2?", "Name a colour."], seed=3)
    assert first.status == Evaluation.Status.GENERATING
    outcome = answers_generate.apply(args=[first.pk]).get()
    assert outcome == {"evaluation": first.pk, "written": 4, "opened": True}
    first.refresh_from_db()
    assert first.status == Evaluation.Status.OPEN and first.items.count() == 2 + 1
    answers = Answer.objects.filter(run=run, seed=3)
    assert answers.count() == 4 and all(a.text for a in answers)
    assert WeightLoad.objects.filter(run=run).exists()  # loaded through the run's engine path
    # Again: nothing left to write, nothing written.
    assert answers_generate.apply(args=[first.pk]).get()["skipped"].startswith("no such evaluation")
    # Another evaluation of the same versions, prompts and seed opens from the cache.
    second = evaluation_create(run=run, by=owner, prompts=["What is 2 + 2?", "Name a colour."], seed=3)
    assert second.status == Evaluation.Status.OPEN and Answer.objects.count() == 4
    # Another seed: new answers.
    third = evaluation_create(run=run, by=owner, prompts=["What is 2 + 2?"], seed=4)
    assert answers_generate.apply(args=[third.pk]).get()["written"] == 2


def test_a_failure_is_recorded_on_the_evaluation(owner: User, run: Run) -> None:
    from workers.explore.blind import answers_generate

    ModelVersion.objects.create(run=run, number=1, checkpoint="/nowhere/at/all", train_step=1)
    Run.objects.filter(pk=run.pk).update(current_version=1)
    run.refresh_from_db()
    evaluation = evaluation_create(run=run, by=owner, prompts=["p"], versions=None)
    outcome = answers_generate.apply(args=[evaluation.pk]).get()
    assert "failed" in outcome
    evaluation.refresh_from_db()
    assert evaluation.status == Evaluation.Status.GENERATING and evaluation.error
