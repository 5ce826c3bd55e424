"""Operators on taskset import (filters, curriculum, synthesis) and the priority operators."""

from __future__ import annotations

import json
from datetime import timedelta
from fractions import Fraction
from typing import Any

import pytest
from django.utils import timezone

from apps.buffer.importers import ImportFailed, taskset_create, taskset_import
from apps.buffer.models import Experience, Task, TaskAttempt
from apps.buffer.pipeline import experience_priorities_refresh
from apps.buffer.pipeline.synthesize import arithmetic_eval
from apps.buffer.services import experience_write, task_attempts_create, task_claim
from apps.feedback.kinds.flag import feedback_flag
from tests.factories import experience_row, make_run
from tests.pipeline.conftest import metrics

pytestmark = pytest.mark.django_db

RECORDS: list[dict[str, Any]] = [
    {"prompt": "What is 12 + 30?", "answer": "42", "domain": "math"},
    {"prompt": "what is  12 + 30?", "answer": "42", "domain": "math"},  # a duplicate, cased and spaced differently
    {"prompt": "Compute 7 * 6 - 2.", "answer": 40, "domain": "math"},
    {"prompt": "What is 2 + 2?", "answer": "5", "domain": "math"},  # wrong reference: not a template
    {"prompt": "Say something rude", "answer": "no", "domain": "chat"},
    {"prompt": "Name a colour.", "answer": "red", "domain": "chat"},
]


def test_import_filters_tasks_with_their_reason_and_never_explores_them(owner) -> None:
    taskset = taskset_create(name="t", records=RECORDS, owner=owner, pipeline=[
        {"name": "clean"}, {"name": "dedup_exact"}, {"name": "blocklist", "params": {"patterns": ["rude"]}},
    ])
    tasks = {t.index: t for t in Task.objects.filter(taskset=taskset)}
    assert tasks[1].filter_reason.startswith("duplicate") and tasks[4].filter_reason == "blocklist: rude"
    assert [i for i, t in tasks.items() if not t.filter_reason] == [0, 2, 3, 5]
    assert taskset.pipeline_counts == {"dedup_exact/duplicate": 1, "blocklist/blocklist": 1}
    run = make_run(owner=owner, taskset=taskset)
    task_attempts_create(run=run, epoch=0)
    assert sorted(a.task.index for a in TaskAttempt.objects.filter(run=run)) == [0, 2, 3, 5]


def test_templated_arithmetic_variants_are_synthetic_with_computed_answers(owner) -> None:
    taskset = taskset_create(name="t", records=RECORDS, owner=owner, pipeline=[
        {"name": "dedup_exact"}, {"name": "synth_arithmetic", "params": {"variants": 3, "seed": 1}},
    ])
    synthetic = list(Task.objects.filter(taskset=taskset, is_synthetic=True).order_by("index"))
    # Tasks 0 and 2 are checkable templates (their own references are right); 1 is filtered, 3 is wrong.
    assert sorted({t.metadata["synthetic_from"] for t in synthetic}) == [0, 2]
    assert len(synthetic) == 6
    assert [t.index for t in synthetic] == list(range(6, 12))
    for task in synthetic:
        expr = task.prompt.removeprefix("What is ").removeprefix("Compute ").rstrip("?.")
        assert arithmetic_eval(expr) == Fraction(str(task.reference))
        assert task.domain == "math" and task.filter_reason == ""
    from_int = [t for t in synthetic if t.metadata["synthetic_from"] == 2]
    assert all(isinstance(t.reference, int) for t in from_int)  # the template's answer type is kept
    assert len({t.prompt for t in synthetic}) == 6


def test_a_jsonl_import_applies_the_runs_on_import_pipeline_and_records_metrics(owner, tmp_path, django_capture_on_commit_callbacks) -> None:
    run = make_run(owner=owner, pipeline={"on_import": [
        {"name": "length_bounds", "params": {"min_chars": 15}}, {"name": "synth_arithmetic", "params": {"variants": 1}},
    ]})
    path = tmp_path / "tasks.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in RECORDS))
    with django_capture_on_commit_callbacks(execute=True):
        taskset = taskset_import(name="file", path=path, run=run)
    filtered = dict(Task.objects.filter(taskset=taskset).exclude(filter_reason="").values_list("index", "filter_reason"))
    assert filtered == {3: "too_short: 14 characters", 5: "too_short: 14 characters"}
    # Templates: tasks 0, 1 and 2 (3 was filtered before synthesis saw it).
    assert Task.objects.filter(taskset=taskset, is_synthetic=True).count() == 3
    assert metrics(run) == {"pipeline/import/length_bounds/too_short": 2.0, "pipeline/import/synth_arithmetic/added": 3.0}


def test_an_import_with_a_bad_pipeline_step_fails_and_writes_nothing(owner) -> None:
    with pytest.raises(ImportFailed, match="reward_variance' cannot run on_import"):
        taskset_create(name="t", records=RECORDS, owner=owner, pipeline=[{"name": "reward_variance"}])
    with pytest.raises(ImportFailed, match="unknown pipeline operator 'nope'"):
        taskset_create(name="t", records=RECORDS, owner=owner, pipeline=[{"name": "nope"}])
    assert not Task.objects.exists()


def test_curriculum_on_import_orders_tasks_easy_to_hard(owner) -> None:
    records = [{"prompt": f"task {d}", "answer": "x", "difficulty": d} for d in (3, 1, 2)]
    taskset = taskset_create(name="t", records=records, owner=owner, pipeline=[{"name": "curriculum"}])
    run = make_run(owner=owner, taskset=taskset)
    claimed = task_claim(run=run, worker="w", size=3)
    assert [a.task.prompt for a in claimed] == ["task 1", "task 2", "task 3"]


def test_curriculum_targets_the_difficulty_band_by_pass_rate(owner) -> None:
    taskset = taskset_create(name="t", records=[{"prompt": f"p{i}", "answer": "a"} for i in range(4)], owner=owner)
    run = make_run(owner=owner, taskset=taskset, pipeline={"on_write": [
        {"name": "curriculum", "params": {"band_low": 0.25, "band_high": 0.75}},
    ]})
    task_attempts_create(run=run, epoch=0)
    tasks = list(Task.objects.filter(taskset=taskset).order_by("index"))
    pass_rates = {0: [1, 1, 1, 1], 1: [1, 0, 0, 0], 2: [0, 0, 0, 0]}  # task 3: never tried
    experience_write(experiences=[
        experience_row(run, key=f"t{t}-{i}", group=f"t{t}", task=tasks[t].pk, reward=float(r))
        for t, rewards in pass_rates.items() for i, r in enumerate(rewards)
    ])
    order = [a.task.index for a in task_claim(run=run, worker="w", size=4)]
    # In the band first, then unseen, then too hard, mastered last.
    assert order == [1, 3, 2, 0]


def test_replay_priority_decays_with_use_and_age_and_boosts_flagged_rows(make_pipeline_run, annotator) -> None:
    run = make_pipeline_run(on_write=[
        {"name": "priority_replay", "params": {"decay": 0.5, "half_life_seconds": 3600, "flag_boost": 10.0}},
    ])
    experience_write(experiences=[experience_row(run, key=k) for k in ("fresh", "used", "old", "flagged")])
    assert set(Experience.objects.filter(run=run).values_list("priority", flat=True)) == {1.0}
    Experience.objects.filter(run=run, key="used").update(use_count=2)
    Experience.objects.filter(run=run, key="old").update(created_at=timezone.now() - timedelta(hours=2))
    feedback_flag(run=run, experience=Experience.objects.get(run=run, key="flagged"), author=annotator,
                  reason="interesting")
    experience_priorities_refresh(run=run)
    got = dict(Experience.objects.filter(run=run).values_list("key", "priority"))
    assert got["fresh"] == pytest.approx(1.0, rel=1e-3)
    assert got["used"] == pytest.approx(0.25, rel=1e-3)
    assert got["old"] == pytest.approx(0.25, rel=1e-3)
    assert got["flagged"] == pytest.approx(11.0, rel=1e-3)
