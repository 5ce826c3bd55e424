"""Smoke test of bench/steering's scripted rater against the real server: it logs in through
the login form, reads each item from the annotation page and rates through the page's own
endpoints, right answers 5 and wrong ones 1, within its label budget."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from apps.buffer.models import Experience
from apps.buffer.services import experience_write
from apps.feedback.models import Assignment, Feedback
from bench.steering.people import PASSWORD, Rater
from tests.factories import add_member, experience_row, make_run

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_the_scripted_rater_rates_through_the_annotation_endpoints(live_url: str, owner: User) -> None:
    run = make_run(owner=owner, feedback={"mode": "human", "overlap": 1})
    rater_user = User.objects.create_user(username="scripted", password=PASSWORD)
    add_member(run, rater_user)
    rows = [experience_row(run, key=f"k{i}", group=f"g{i // 2}", status="pending", reward=None,
                           prompt_text=f"What is {i} + 3?",
                           response_text=f"<answer>{i + 3 if i % 2 == 0 else i + 4}</answer>") for i in range(6)]
    ids = experience_write(experiences=rows).ids
    rater = Rater(live_url, "scripted", careful=True, seed=0)
    assert rater.rate(run.pk, 4) == 4
    rated = dict(Feedback.objects.filter(run=run, kind="rating").values_list("experience_id", "value__score"))
    assert len(rated) == 4
    truth = {e.pk: (5 if int(e.key[1:]) % 2 == 0 else 1) for e in Experience.objects.filter(pk__in=ids)}
    assert all(score == truth[pk] for pk, score in rated.items())
    # Within budget: what it did not rate went back to the queue (skipped), nothing left leased.
    assert not Assignment.objects.filter(run=run, status="leased").exists()
    assert rater.rate(run.pk, None) == 0  # skipped items are not offered to it again
