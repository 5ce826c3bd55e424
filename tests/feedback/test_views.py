"""The annotation pages over HTTP: who may open what, and the forms' round trips."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from apps.buffer.models import Experience
from apps.feedback.models import Assignment, Feedback
from apps.runs.models import Run
from tests.factories import add_member, make_experiences, make_run, make_user

pytestmark = pytest.mark.django_db
HX: dict[str, Any] = {"HTTP_HX_REQUEST": "true"}


def _client(user: User) -> Client:
    c = Client()
    c.force_login(user)
    return c


def _page(run: Run) -> str:
    return reverse("feedback:page", kwargs={"run_id": run.pk})


def test_an_annotator_cannot_open_a_run_they_are_not_assigned_to(run: Run, owner: User, annotator: User, outsider: User) -> None:
    other = make_run(owner=owner, name="not yours")
    exp = make_experiences(other, groups=1, group_size=2)[0]
    assert _client(annotator).get(_page(run)).status_code == 200
    for user in (annotator, outsider):
        c = _client(user)
        assert c.get(_page(other)).status_code == 404
        assert c.get(reverse("feedback:rank", kwargs={"run_id": other.pk, "experience_id": exp.pk})).status_code == 404
        assert c.post(reverse("feedback:edit", kwargs={"run_id": other.pk, "experience_id": exp.pk}),
                      {"text": "x"}).status_code == 404
    assert not Experience.objects.filter(is_expert=True).exists()


def test_anonymous_visitors_are_sent_to_log_in(run: Run) -> None:
    response = Client().get(_page(run))
    assert response.status_code == 302 and response["Location"].startswith(reverse("login"))


def test_a_viewer_sees_the_run_but_cannot_give_feedback(owner: User) -> None:
    run = make_run(owner=owner, feedback={"mode": "blend"})
    exp = make_experiences(run, groups=1, group_size=2, status="pending")[0]
    viewer = make_user("viewer")
    add_member(run, viewer, role="viewer")
    c = _client(viewer)
    page = c.get(_page(run))
    assert page.status_code == 200 and b"form class=\"rate\"" not in page.content
    assert not Assignment.objects.filter(annotator=viewer).exists()
    assert c.post(reverse("feedback:rank", kwargs={"run_id": run.pk, "experience_id": exp.pk}), {}).status_code == 403
    assert c.post(reverse("feedback:edit", kwargs={"run_id": run.pk, "experience_id": exp.pk}), {"text": "x"}).status_code == 403
    assert not Feedback.objects.exists()


def _blend_run_with_two_annotators(owner: User, *, pending: int) -> tuple[Run, User, User]:
    """A blend run (each item to one annotator) with `pending` items in groups of up to two,
    and its two annotators, Ann A and Ann B."""
    run = make_run(owner=owner, feedback={"mode": "blend", "overlap": 1})
    make_experiences(run, groups=(pending + 1) // 2, group_size=min(2, pending), status="pending")
    a, b = make_user("ann-a"), make_user("ann-b")
    add_member(run, a)
    add_member(run, b)
    return run, a, b


def test_two_annotators_with_overlap_one_get_different_items(owner: User, settings) -> None:
    settings.RFT_ANNOTATION_QUEUE_SIZE = 2
    run, a, b = _blend_run_with_two_annotators(owner, pending=4)
    ids = {}
    for user in (a, b):
        html = _client(user).get(_page(run)).content.decode()
        ids[user.username] = set(re.findall(r'data-experience="(\d+)"', html))
    assert ids["ann-a"] and ids["ann-b"] and not ids["ann-a"] & ids["ann-b"]
    assert len(ids["ann-a"] | ids["ann-b"]) == 4


def test_two_annotators_with_overlap_two_each_rate_every_item(owner: User) -> None:
    run = make_run(owner=owner, feedback={"mode": "human", "overlap": 2})
    exps = make_experiences(run, groups=1, group_size=3, status="pending")
    raters = [make_user("ann-a"), make_user("ann-b")]
    for user, score in zip(raters, ("5", "3")):
        add_member(run, user)
        c = _client(user)
        c.get(_page(run))
        for a in Assignment.objects.filter(annotator=user):
            url = reverse("feedback:rate", kwargs={"run_id": run.pk, "assignment_id": a.pk})
            assert c.post(url, {"score": score}, **HX).status_code == 200
    for e in exps:
        assert sorted(Feedback.objects.filter(experience=e, kind="rating").values_list("author__username", flat=True)) == ["ann-a", "ann-b"]
    assert {(e.status, e.reward) for e in Experience.objects.filter(pk__in=[e.pk for e in exps])} == {("ready", 0.75)}


def test_a_refused_rating_says_why_and_stores_nothing(run: Run, annotator: User) -> None:
    make_experiences(run, groups=1, group_size=1)
    c = _client(annotator)
    c.get(_page(run))
    a = Assignment.objects.get(annotator=annotator)
    url = reverse("feedback:rate", kwargs={"run_id": run.pk, "assignment_id": a.pk})
    response = c.post(url, {"score": "7"}, **HX)
    assert response.status_code == 400 and b"1 to 5" in response.content
    response = c.post(url, {}, **HX)
    assert response.status_code == 400 and b"give a rating" in response.content
    assert not Feedback.objects.exists()


def test_forms_work_without_javascript(run: Run, annotator: User) -> None:
    exps = make_experiences(run, groups=1, group_size=2)
    c = _client(annotator)
    c.get(_page(run))
    rank_url = reverse("feedback:rank", kwargs={"run_id": run.pk, "experience_id": exps[0].pk})
    assert b"<html" in c.get(rank_url).content  # a full page, not a fragment
    response = c.post(rank_url, {f"rank_{exps[0].pk}": "2", f"rank_{exps[1].pk}": "1"})
    assert response.status_code == 302 and response["Location"] == _page(run)
    fb = Feedback.objects.get(kind="ranking")
    assert fb.value["order"] == [exps[1].pk, exps[0].pk]


def test_a_completion_is_rendered_without_its_html(run: Run, annotator: User) -> None:
    make_experiences(run, groups=1, group_size=1,
                     response_text='<script>alert(1)</script><img src=x onerror=alert(2)> [x](javascript:alert(3))')
    html = _client(annotator).get(_page(run)).content.decode()
    assert "<script>alert(1)" not in html and "<img src=x" not in html and 'href="javascript:' not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_a_pairwise_choice_becomes_a_dpo_pair(run: Run, annotator: User) -> None:
    from apps.feedback.selectors import dpo_pairs

    a, b = make_experiences(run, groups=1, group_size=2)
    c = _client(annotator)
    url = reverse("feedback:compare", kwargs={"run_id": run.pk, "experience_id": a.pk})
    panel = c.get(url, **HX).content.decode()
    assert f"B · #{b.pk}" in panel
    assert c.post(url, {"other": str(b.pk), "winner": "b"}, **HX).status_code == 200
    [pair] = dpo_pairs(run=run)
    assert (pair.chosen_id, pair.rejected_id, pair.prompt) == (b.pk, a.pk, a.prompt_text)
    assert c.post(url, {"other": str(b.pk), "winner": "maybe"}, **HX).status_code == 400


def test_skipping_over_http_hands_the_item_back(owner: User, settings) -> None:
    settings.RFT_ANNOTATION_QUEUE_SIZE = 1
    run, a, b = _blend_run_with_two_annotators(owner, pending=1)
    _client(a).get(_page(run))
    assert b'data-experience="' not in _client(b).get(_page(run)).content
    mine = Assignment.objects.get(annotator=a)
    response = _client(a).post(reverse("feedback:skip", kwargs={"run_id": run.pk, "assignment_id": mine.pk}), **HX)
    assert response.status_code == 200 and b"skipped" in response.content
    assert f'data-experience="{mine.experience_id}"'.encode() in _client(b).get(_page(run)).content
