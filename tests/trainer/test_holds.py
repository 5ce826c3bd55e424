"""A group a person has open waits for them: the trainer's claim skips it until the hold ends
(no sign of work for feedback.hold_seconds) or its cap passes (feedback.hold_cap_seconds after
the item was handed out), however busy the person is (issue #31, item 1)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from apps.buffer.models import Experience
from apps.buffer.services import experience_write
from apps.feedback.services import assignment_claim, feedback_wait_expire
from apps.feedback.kinds.rating import feedback_rate
from apps.runs.models import Run
from tests.factories import add_member, experience_row, make_run, make_user

pytestmark = pytest.mark.django_db(transaction=True)  # holds renew after a label commits

HOLD, CAP = 30.0, 120.0


class Clock:
    """The wall clock every service reads (django.utils.timezone.now), moved by hand."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.at = timezone.now()
        monkeypatch.setattr(timezone, "now", lambda: self.at)

    def wait(self, seconds: float) -> datetime:
        self.at += timedelta(seconds=seconds)
        return self.at


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[Clock]:
    yield Clock(monkeypatch)


def _run(anna: User) -> Run:
    run = make_run(owner=make_user("olga"), train_batch_size=8, repeat_times=4,
                   feedback={"mode": "blend", "overlap": 1, "wait_seconds": 10, "fallback": "auto",
                             "hold_seconds": HOLD, "hold_cap_seconds": CAP})
    add_member(run, anna)
    return run


def _group(run: Run, name: str) -> list[int]:
    rows = [experience_row(run, key=f"{name}-{i}", group=name, status="pending", reward=None, auto_reward=0.25 * i,
                           response_text=f"answer {name}.{i}") for i in range(4)]
    return sorted(experience_write(experiences=rows).ids)


def _trainer_takes(run: Run) -> set[int]:
    """One claim of the trainer (workers.trainer.train_batch_claim, as a train step makes it); the batch
    goes back to the buffer so the next claim may see it again."""
    from apps.runs.ports import run_view_of
    from workers.trainer import train_batch_claim

    _, rows = train_batch_claim(run=run_view_of(Run.objects.get(pk=run.pk)), worker="trainer-1", min_version=None)
    ids = {e.pk for e in rows}
    Experience.objects.filter(pk__in=ids).update(status="ready", lease_owner="", lease_expires_at=None)
    return ids


def test_a_held_group_does_not_train_until_the_hold_ends(clock: Clock, anna: User) -> None:
    run = _run(anna)
    older = _group(run, "older")
    opened = _group(run, "opened")
    # Anna opens the page: the freshest group's first two items are hers to rate.
    mine = assignment_claim(run=run, annotator=anna, size=2)
    assert {a.experience_id for a in mine} <= set(opened)
    # The wait window ends for both groups: both become trainable...
    clock.wait(11)
    assert feedback_wait_expire().groups_ready == 2
    # ... but the trainer takes only the group nobody has open.
    assert _trainer_takes(run) == set(older)
    # She rates one item: a sign of work, the group keeps waiting for her second one.
    clock.wait(20)
    feedback_rate(run=run, experience=mine[0].experience_id, score=4, author=anna)
    clock.wait(HOLD - 5)
    assert _trainer_takes(run).isdisjoint(opened)
    # She walks away: once the hold has run out with no sign of work, the group trains, her
    # rating folded into its reward.
    clock.wait(6)
    assert set(opened) <= _trainer_takes(run)
    assert Experience.objects.get(pk=mine[0].experience_id).human_reward == 0.75


def test_a_hold_renewed_while_the_person_works_ends_at_its_cap(clock: Clock, anna: User) -> None:
    run = _run(anna)
    opened = _group(run, "opened")
    assignment_claim(run=run, annotator=anna, size=2)
    clock.wait(11)
    feedback_wait_expire()
    # Her page polls every 20 s (each poll claims, which renews her holds): she keeps the
    # group well past one hold ...
    for _ in range(int(CAP // 20) - 1):
        clock.wait(20)
        assignment_claim(run=run, annotator=anna, size=2)
        assert _trainer_takes(run) == set()
    # ... but not past the cap, 120 s after the items were handed to her.
    clock.wait(CAP - 11 - 20 * (int(CAP // 20) - 1) + 1)
    assignment_claim(run=run, annotator=anna, size=2)
    assert _trainer_takes(run) == set(opened)


def test_nothing_is_held_when_the_run_says_so(clock: Clock, anna: User) -> None:
    run = _run(anna)
    cfg = run.config
    cfg["feedback"]["hold_seconds"] = 0
    Run.objects.filter(pk=run.pk).update(config=cfg)
    run = Run.objects.get(pk=run.pk)
    opened = _group(run, "opened")
    assignment_claim(run=run, annotator=anna, size=2)
    clock.wait(11)
    feedback_wait_expire()
    assert _trainer_takes(run) == set(opened)
