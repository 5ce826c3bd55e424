"""Round 49 renamed two plugin hooks and round 64 an algorithm's `learner_group`
(docs/concepts.md#names): a plugin written on an old name is refused where it is declared, never
silently ignored."""

from __future__ import annotations

import pytest

from apps.feedback.kinds import FeedbackKind


def test_a_feedback_kind_on_the_old_signals_name_is_refused() -> None:
    with pytest.raises(TypeError, match="signals is now votes"):
        type("OldKind", (FeedbackKind,), {"signals": lambda self, fb: []})


def test_an_objective_on_the_old_no_signal_name_is_refused() -> None:
    from workers.algorithms.objectives import Objective  # torch: only this test pays for it

    with pytest.raises(TypeError, match="no_signal is now no_gradient"):
        type("OldObjective", (Objective,), {"no_signal": lambda self, batch: None})
    assert type("NewObjective", (Objective,), {"no_gradient": lambda self, batch: None})


def test_an_algorithm_on_the_old_learner_group_name_is_refused() -> None:
    from kernel.algorithms import AlgorithmType

    with pytest.raises(TypeError, match="learner_group is now learner_gang"):
        type("OldAlgorithm", (AlgorithmType,), {"learner_group": True})
    new: type[AlgorithmType] = type("NewAlgorithm", (AlgorithmType,), {"learner_gang": True})
    assert new.learner_gang


@pytest.mark.django_db
def test_a_lost_ranks_stored_failure_is_renamed_to_the_learner_gang_and_back() -> None:
    """The one stored name of the learner gang: a lost rank's `TaskFailure` (its task and its
    exception's class), written "learner group", `GroupLost`, before round 64 (the run page's
    worker-errors panel shows them)."""
    import importlib
    from pathlib import Path

    from django.apps import apps as django_apps

    import apps.runs.migrations as runs_migrations
    from apps.runs.models import TaskFailure
    from tests.factories import make_run
    from workers.gang_lost import GangLost
    from workers.trainer.task import GANG_LOST_TASK

    (path,) = Path(runs_migrations.__file__).parent.glob("*_learner_gang.py")  # numbered when merged
    migration = importlib.import_module(f"apps.runs.migrations.{path.stem}")
    run = make_run()
    old = TaskFailure.objects.create(run=run, task="learner group", step=2, exception="GroupLost")
    other = TaskFailure.objects.create(run=run, task="train", step=2, exception="RuntimeError")
    migration.gang_forward(django_apps, None)
    renamed = TaskFailure.objects.get(pk=old.pk)
    assert (renamed.task, renamed.exception) == (GANG_LOST_TASK, "GangLost") == ("learner gang", GangLost.__name__)
    assert TaskFailure.objects.get(pk=other.pk).task == "train"
    migration.gang_backward(django_apps, None)
    back = TaskFailure.objects.get(pk=old.pk)
    assert (back.task, back.exception) == ("learner group", "GroupLost")
