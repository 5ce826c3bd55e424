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
from apps.feedback.handout.lease import assignment_claim
from apps.feedback.handout.expiry import feedback_wait_expire
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
    """One claim of the trainer (workers.trainer.step.train_batch_claim, as a train step makes it); the batch
    goes back to the buffer so the next claim may see it again."""
    from apps.runs.ports import run_view_of
    from workers.trainer.step import train_batch_claim

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


def test_a_held_group_beside_a_full_batch_leaves_the_trainer_its_batch(clock: Clock, anna: User) -> None:
    """Issue 64 item 9: the demo's loop stalled ~90 s twice ("the trainer waits for a full
    batch: 48 of 64" while 121 were ready) because every item of a person's queue (8 on the
    annotation page, renewed by its counts poll) held its group: one person held a whole batch.
    Now only the items on top of their queue hold; the rest of the buffer trains."""
    from apps.control.conductor import train_readiness

    run = _run(anna)
    groups = {name: _group(run, name) for name in ("a", "b", "c")}
    queue = assignment_claim(run=run, annotator=anna, size=8)  # the page's queue: two whole groups
    assert len({Experience.objects.get(pk=a.experience_id).group_id for a in queue}) == 2
    clock.wait(11)
    assert feedback_wait_expire().groups_ready == 3
    on_top = Experience.objects.get(pk=min(queue, key=lambda a: a.pk).experience_id).group_id
    held = set(groups[on_top])
    assert set(Experience.objects.filter(held_until__gt=clock.at).values_list("pk", flat=True)) == held
    assert train_readiness(run=Run.objects.get(pk=run.pk)).ready
    taken = _trainer_takes(run)
    assert len(taken) == 8 and taken.isdisjoint(held)
    # Her poll (the counts, every 10 s) renews only the groups on top: it writes no hold below them.
    from apps.feedback.handout.holds import holds_renew_when_due

    clock.wait(10)
    holds_renew_when_due(run=Run.objects.get(pk=run.pk), annotator=anna)
    assert set(Experience.objects.filter(held_until__gt=clock.at).values_list("pk", flat=True)) == held


def test_the_run_page_says_which_groups_training_waits_on_and_until_when(clock: Clock, anna: User) -> None:
    from django.test import Client

    from apps.control.selectors import run_waiting

    run = _run(anna)
    free, opened = _group(run, "free"), _group(run, "opened")
    mine = assignment_claim(run=run, annotator=anna, size=2)
    assert {a.experience_id for a in mine} <= set(opened)
    clock.wait(11)
    feedback_wait_expire()
    Run.objects.filter(pk=run.pk).update(status=Run.Status.RUNNING)
    run = Run.objects.get(pk=run.pk)
    ends = max(t for t in Experience.objects.filter(pk__in=opened).values_list("held_until", flat=True) if t is not None)
    latest = min(a.created_at for a in mine) + timedelta(seconds=CAP)
    waits = {w["what"]: w for w in run_waiting(run=run)}
    assert "4 of 8 trainable" in waits["batch"]["text"]
    text = waits["held"]["text"]
    assert text.startswith("1 group ready to train (4 experiences) is held for people who have it open (anna 1)")
    assert f"end by {timezone.localtime(ends):%H:%M:%S} unless they keep working" in text
    assert f"by {timezone.localtime(latest):%H:%M:%S} at the latest" in text
    client = Client()
    client.force_login(run.owner)
    page = client.get(f"/runs/{run.pk}/").content.decode()
    assert 'data-what="held"' in page and "held for people who have it open (anna 1)" in page
    assert free  # the other group is the one the trainer has
