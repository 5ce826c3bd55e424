"""The annotation queue: leases, overlap, skips and abandoned items."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.utils import timezone

from apps.feedback.models import Assignment
from apps.feedback.services import assignment_claim, assignment_reap, assignment_skip, feedback_rate
from tests.factories import make_experiences, make_run, make_user

pytestmark = pytest.mark.django_db


def test_overlap_one_hands_each_item_to_one_annotator(owner: User) -> None:
    run = make_run(owner=owner, feedback={"mode": "blend", "overlap": 1})
    make_experiences(run, groups=2, group_size=3, status="pending")
    a, b = make_user("ann-a"), make_user("ann-b")
    first = assignment_claim(run=run, annotator=a, size=4)
    second = assignment_claim(run=run, annotator=b, size=4)
    assert len(first) == 4 and len(second) == 2
    assert not {x.experience_id for x in first} & {x.experience_id for x in second}


def test_overlap_two_hands_each_item_to_two_annotators(owner: User) -> None:
    run = make_run(owner=owner, feedback={"mode": "blend", "overlap": 2})
    exps = make_experiences(run, groups=1, group_size=3, status="pending")
    a, b, c = make_user("ann-a"), make_user("ann-b"), make_user("ann-c")
    got = {u.username: {x.experience_id for x in assignment_claim(run=run, annotator=u, size=5)} for u in (a, b, c)}
    assert got["ann-a"] == got["ann-b"] == {e.pk for e in exps}
    assert got["ann-c"] == set()


def test_concurrent_claimers_never_exceed_the_overlap(transactional_db: None, owner: User) -> None:
    run = make_run(owner=owner, feedback={"mode": "blend", "overlap": 1})
    make_experiences(run, groups=5, group_size=4, status="pending")
    users = [make_user(f"racer{i}") for i in range(4)]
    barrier = threading.Barrier(len(users))

    def claim(user: User) -> None:
        barrier.wait()
        try:
            assignment_claim(run=run, annotator=user, size=6)
        finally:
            connection.close()  # this thread's own connection

    threads = [threading.Thread(target=claim, args=(u,)) for u in users]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ids = list(Assignment.objects.values_list("experience_id", flat=True))
    assert len(ids) == len(set(ids)) == 20


def test_a_skipped_item_goes_to_someone_else(owner: User) -> None:
    run = make_run(owner=owner, feedback={"mode": "blend", "overlap": 1})
    make_experiences(run, groups=1, group_size=1, status="pending")
    a, b = make_user("ann-a"), make_user("ann-b")
    [mine] = assignment_claim(run=run, annotator=a, size=1)
    assert assignment_claim(run=run, annotator=b, size=1) == []
    assert assignment_skip(assignment=mine)
    assert assignment_claim(run=run, annotator=a, size=1) == []  # not offered again to who skipped it
    [theirs] = assignment_claim(run=run, annotator=b, size=1)
    assert theirs.experience_id == mine.experience_id


def test_an_abandoned_lease_expires_and_the_item_goes_back(owner: User) -> None:
    run = make_run(owner=owner, feedback={"mode": "blend", "overlap": 1})
    make_experiences(run, groups=1, group_size=1, status="pending")
    a, b = make_user("ann-a"), make_user("ann-b")
    [mine] = assignment_claim(run=run, annotator=a, size=1, lease_seconds=60)
    assert assignment_reap(now=timezone.now()) == 0
    assert assignment_reap(now=timezone.now() + timedelta(seconds=61)) == 1
    [theirs] = assignment_claim(run=run, annotator=b, size=1)
    assert theirs.experience_id == mine.experience_id


def test_rating_an_item_closes_it_and_the_queue_tops_up(owner: User) -> None:
    run = make_run(owner=owner, feedback={"mode": "blend", "overlap": 1})
    make_experiences(run, groups=1, group_size=3, status="pending")
    a = make_user("ann-a")
    first, second = assignment_claim(run=run, annotator=a, size=2)
    assert assignment_claim(run=run, annotator=a, size=2) == []  # queue already full
    feedback_rate(run=run, author=a, experience=first.experience_id, score=4)
    first.refresh_from_db()
    assert first.status == "done"
    [third] = assignment_claim(run=run, annotator=a, size=2)
    assert third.experience_id not in (first.experience_id, second.experience_id)
