"""What the pages say, as people say it (issue 32's wording list), through the views: a saved
comparison names the winner in words, not "(a)"; a run the system finished reads "finished",
not "finish by system" or "finished by None"; one a person started names them; a flag reads as
its flags, not "flag flagged: broken"."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from apps.feedback.kinds.flag import feedback_flag
from apps.runs.models import Run
from apps.runs.services import run_transition
from tests.factories import add_member, make_experiences, make_run, make_taskset

pytestmark = pytest.mark.django_db

HX: dict[str, Any] = {"HTTP_HX_REQUEST": "true"}


@pytest.fixture
def blend(owner: User, annotator: User) -> Run:
    run = make_run(owner=owner, taskset=make_taskset(owner=owner), name="words", feedback={"mode": "blend"})
    add_member(run, annotator)
    run_transition(run=run, action="start", actor=owner)
    return run


def signed_in(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.mark.parametrize(("winner", "said"), [("a", "A is better"), ("b", "B is better"), ("tie", "a tie")])
def test_a_saved_comparison_names_the_winner_in_words(blend: Run, annotator: User, winner: str, said: str) -> None:
    a, b = make_experiences(blend, groups=1, group_size=2, status="pending")
    url = reverse("feedback:compare", kwargs={"run_id": blend.pk, "experience_id": a.pk})
    html = signed_in(annotator).post(url, {"other": b.pk, "winner": winner}, **HX).content.decode()
    assert f"Preference saved: {said}" in html
    assert "(a)" not in html and "(b)" not in html and "saved (" not in html


def test_the_audit_says_who_did_what_and_nothing_for_the_system(blend: Run, owner: User) -> None:
    run_transition(run=blend, action="finish")  # the loop finishing it: no person
    html = signed_in(owner).get(reverse("runs:audit", args=[blend.pk])).content.decode()
    assert "started by owner" in html and "finished" in html
    for wrong in ("finish by", "by system", "by None", "finished by"):
        assert wrong not in html, wrong


def test_a_flag_in_my_submissions_reads_as_its_flags(blend: Run, annotator: User) -> None:
    (e,) = make_experiences(blend, groups=1, group_size=1, status="pending")
    feedback_flag(run=blend, experience=e, flags=["broken", "off_task"], author=annotator)
    html = signed_in(annotator).get(reverse("feedback:mine", kwargs={"run_id": blend.pk})).content.decode()
    assert "broken, off task" in html
    assert "flagged: broken" not in html
