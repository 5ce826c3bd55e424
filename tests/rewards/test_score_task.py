"""The reward queue on real Postgres, Redis and a Celery worker subprocess."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from typing import Any
from pathlib import Path

import pytest

from apps.buffer.importers import taskset_create
from apps.buffer.models import Experience, Task
from apps.buffer.services import experience_write
from apps.rewards.services import experience_rewards_apply
from apps.runs.models import Run
from rftweb.celery import app
from tests.factories import experience_row, first_task, make_run, make_taskset, make_user
from tests.servers import celery_worker
from apps.runs.ports import run_view_of

ROOT = Path(__file__).resolve().parents[2]
GOOD = "```python\ndef add(a, b):\n    return a + b\n```"
HALF = "def add(a, b):\n    return a + b if a > 0 else 0\n"
LOOP = "def add(a, b):\n    while True:\n        pass\n"
TESTS = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(-2, -2) == -4", "assert add(0, 5) == 5"]

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


@pytest.fixture(scope="module")
def reward_worker(django_db_setup: None, django_db_blocker: Any) -> Iterator[subprocess.Popen[bytes]]:
    """`celery worker -Q reward` against this session's test database and Redis database."""
    with celery_worker("reward", name="rewards-test") as proc:
        yield proc


def _code_run(*, feedback: str = "auto") -> tuple[Run, list[Task]]:
    owner = make_user()
    taskset = taskset_create(
        name="code",
        records=[{"prompt": "Write add(a, b).", "tests": TESTS, "domain": "code"},
                 {"prompt": "What is 12 + 7?", "answer": "19", "domain": "math"}],
        owner=owner,
    )
    run = make_run(
        owner=owner, taskset=taskset,
        rewards=[{"name": "math_format", "weight": 0.5},
                 {"name": "code_exec", "weight": 2.0, "domains": ["code"], "params": {"timeout": 3, "test_timeout": 1}}],
        feedback={"mode": feedback},
    )
    return run, list(taskset.tasks.order_by("index"))


def _write(run: Run, task: Task, completions: list[str], *, awaiting: list[str] | None = None) -> list[int]:
    rows = [
        experience_row(run, key=f"{task.pk}-{i}", group=f"g{task.pk}", task=task.pk, response_text=c,
                       status="pending", reward=None, reward_parts={"math_format": 0.0},
                       metadata={"awaiting_rewards": ["code_exec"] if awaiting is None else awaiting})
        for i, c in enumerate(completions)
    ]
    return experience_write(experiences=rows).ids


def _send(run: Run, ids: list[int]):
    return app.send_task("workers.reward.scoring.score_experiences", args=[run.pk, ids], queue="reward")


def test_the_reward_worker_scores_code_and_makes_experiences_ready(reward_worker: subprocess.Popen) -> None:
    run, (code_task, _math) = _code_run()
    ids = _write(run, code_task, [GOOD, HALF, LOOP, "not code at all"])
    outcome = _send(run, ids).get(timeout=90)
    assert outcome == {"applied": 4, "skipped": 0}
    rows = {e.response_text: e for e in Experience.objects.filter(pk__in=ids)}
    expected = {GOOD: 1.0, HALF: 0.5, LOOP: 0.0, "not code at all": 0.0}
    for text, fraction in expected.items():
        exp = rows[text]
        assert exp.reward_parts == {"math_format": 0.0, "code_exec": fraction}
        assert exp.auto_reward == pytest.approx(2.0 * fraction)
        assert exp.reward == pytest.approx(2.0 * fraction)
        assert exp.status == "ready"
        assert exp.metadata["awaiting_rewards"] == []


def test_scoring_twice_applies_once(reward_worker: subprocess.Popen) -> None:
    run, (code_task, _math) = _code_run()
    ids = _write(run, code_task, [GOOD, HALF])
    first, second = _send(run, ids), _send(run, ids)
    results = [first.get(timeout=90), second.get(timeout=90)]
    assert sum(r["applied"] for r in results) == 2
    # And a late duplicate apply (a second worker that scored the same rows) changes nothing.
    assert experience_rewards_apply(run=run, scored={i: {"code_exec": 0.0} for i in ids}) == []
    assert sorted(r or 0.0 for r in Experience.objects.filter(pk__in=ids).values_list("auto_reward", flat=True)) == [1.0, 2.0]


def test_in_human_feedback_mode_scored_experiences_stay_pending(reward_worker: subprocess.Popen) -> None:
    run, (code_task, _math) = _code_run(feedback="human")
    ids = _write(run, code_task, [GOOD])
    assert _send(run, ids).get(timeout=90) == {"applied": 1, "skipped": 0}
    exp = Experience.objects.get(pk=ids[0])
    assert (exp.status, exp.reward, exp.auto_reward) == ("pending", None, 2.0)


def test_experiences_not_awaiting_rewards_are_left_alone(reward_worker: subprocess.Popen) -> None:
    run, (code_task, math_task) = _code_run()
    done = _write(run, math_task, ["<answer>19</answer>"], awaiting=[])
    assert _send(run, done).get(timeout=90) == {"applied": 0, "skipped": 1}
    assert Experience.objects.get(pk=done[0]).status == "pending"
    assert _send(run, [10**9]).get(timeout=90) == {"applied": 0, "skipped": 1}


def test_enqueueing_waits_for_the_commit(reward_worker: subprocess.Popen) -> None:
    from django.db import transaction

    from apps.rewards.services import rewards_remote_enqueue

    run, (code_task, _math) = _code_run()
    with transaction.atomic():
        ids = _write(run, code_task, [GOOD])
        rewards_remote_enqueue(run_id=run.pk, experience_ids=ids)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        exp = Experience.objects.get(pk=ids[0])
        if exp.status == "ready":
            break
        time.sleep(0.3)
    assert (exp.status, exp.reward) == ("ready", 2.0)


def test_a_failing_scorer_is_reported_scored_zero_and_recorded(tmp_path: Path) -> None:
    from workers.reward.scoring import rewards_remote_score

    owner = make_user()
    taskset = make_taskset(owner=owner)
    run = make_run(owner=owner, taskset=taskset,
                   rewards=[{"name": "exact_match"}, {"name": "reward_model", "params": {"model": str(tmp_path / "gone")}}])
    task = first_task(taskset)
    ids = _write(run, task, ["<answer>0</answer>"], awaiting=["reward_model"])
    exps = list(Experience.objects.filter(pk__in=ids).select_related("task"))
    scored, errors, raised = rewards_remote_score(run=run_view_of(run), experiences=exps)
    assert raised and scored == {ids[0]: {"reward_model": 0.0}}
    assert "reward_model" in errors[ids[0]]
    assert experience_rewards_apply(run=run, scored=scored, errors=errors) == ids
    exp = Experience.objects.get(pk=ids[0])
    assert exp.metadata["reward_errors"]["reward_model"] and exp.metadata["awaiting_rewards"] == []
    assert exp.status == "ready"
