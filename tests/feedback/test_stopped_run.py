"""One rule for a stopped run (issue 64 item 7): once a run is stopped, finished or failed it
takes no labels. Its queue says it is closed and why; a rating, a ranking, a comparison and a
correction are refused at the page and at the API, and Undo and Revise with the same words.
On main a stopped run kept its queue open, took a rating without a word, then refused the
rating's Undo ("its labels can no longer change")."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from playwright.sync_api import expect

from apps.envapi.services import api_key_create
from apps.feedback.models import Feedback
from apps.feedback.handout.lease import assignment_claim
from apps.runs.models import Run
from apps.runs.selectors import run_takes_feedback
from apps.runs.services import run_transition
from tests.dashboard.test_pages_live import in_a_thread
from tests.factories import add_member, make_experiences, make_run, make_taskset
from tests.servers import BROWSER_WAIT_MS, login

STOPPED_WORDS = "is stopped: it takes no more feedback (it trains nothing until its owner starts it again)"


def _running(owner: User, annotator: User) -> Run:
    run = make_run(owner=owner, taskset=make_taskset(owner=owner), feedback={"mode": "blend", "overlap": 1})
    add_member(run, annotator)
    run_transition(run=run, action="start", actor=owner)
    run.refresh_from_db()
    return run


def _client(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.mark.django_db
def test_a_stopped_run_refuses_every_label_and_its_withdrawal_in_the_same_words(owner: User, annotator: User) -> None:
    run = _running(owner, annotator)
    members = make_experiences(run, groups=1, group_size=3, status="pending")
    client = _client(annotator)
    queue = assignment_claim(run=run, annotator=annotator, size=3)
    assert client.post(f"/runs/{run.pk}/annotate/items/{queue[0].pk}/rate/", {"score": "4"}).status_code == 302
    run_transition(run=run, action="stop", actor=owner)
    run.refresh_from_db()
    assert not run_takes_feedback(run=run)
    before = Feedback.objects.count()
    words = f"run {run.pk} {STOPPED_WORDS}"

    # The page's doors: a rating, a comparison, a ranking, a correction.
    rated = client.post(f"/runs/{run.pk}/annotate/items/{queue[1].pk}/rate/", {"score": "2"}, HTTP_HX_REQUEST="true")
    assert (rated.status_code, rated.content.decode()) == (400, words)
    compared = client.post(f"/runs/{run.pk}/annotate/experiences/{members[0].pk}/compare/",
                           {"other": members[1].pk, "winner": "a"}, HTTP_HX_REQUEST="true")
    assert compared.status_code == 400 and words in compared.content.decode()
    ranked = client.post(f"/runs/{run.pk}/annotate/experiences/{members[0].pk}/rank/",
                         {f"rank_{m.pk}": str(i + 1) for i, m in enumerate(members)}, HTTP_HX_REQUEST="true")
    assert ranked.status_code == 400 and words in ranked.content.decode()
    edited = client.post(f"/runs/{run.pk}/annotate/experiences/{members[0].pk}/edit/", {"text": "better"},
                         HTTP_HX_REQUEST="true")
    assert edited.status_code == 400 and words in edited.content.decode()
    # The API's.
    _, raw = api_key_create(name="env", runs=[run], actions=["feedback"], rate_limit_per_minute=100)
    api = Client().post(f"/api/v1/runs/{run.pk}/feedback", json.dumps(
        {"kind": "rating", "experience_id": members[1].pk, "score": 4}), content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert api.status_code == 409 and words in api.json()["detail"]
    # Undo (no label named) and Revise (one named) say the same, and the label stays.
    rating = Feedback.objects.get(run=run, author=annotator)
    for body in ({}, {"feedback": rating.pk}):
        undone = client.post(f"/runs/{run.pk}/annotate/mine/", body, HTTP_HX_REQUEST="true")
        assert (undone.status_code, undone.content.decode()) == (400, words)
    assert Feedback.objects.count() == before
    # The queue is closed, says why, and hands nothing out.
    page = client.get(f"/runs/{run.pk}/annotate/").content.decode()
    assert "This run is stopped: it takes no more feedback (it trains nothing until its owner starts it again)" in page
    assert 'data-assignment="' not in page
    assert assignment_claim(run=run, annotator=annotator, size=3) == []
    # Started again, it takes labels again.
    run_transition(run=run, action="start", actor=owner)
    run.refresh_from_db()
    assert run_takes_feedback(run=run)
    assert client.post(f"/runs/{run.pk}/annotate/mine/", {"feedback": rating.pk}).status_code == 302
    assert not Feedback.objects.filter(pk=rating.pk).exists()


@pytest.mark.browser
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_open_queue_closes_and_a_rating_sent_meanwhile_is_refused_in_words(
        page: Any, live_url: str, owner: User, annotator: User) -> None:
    run = _running(owner, annotator)
    make_experiences(run, groups=1, group_size=2, status="pending")
    path = f"/runs/{run.pk}/annotate/"
    login(page, live_url, "annotator", next_path=path)
    page.wait_for_url(f"**{path}")
    page.wait_for_selector("#annotate[data-live=open]")
    card = page.locator("#queue .item:not(.done)").first
    expect(card).to_be_visible()
    # Stopped behind the page's back (no event yet): the rating it sends is refused, in words.
    Run.objects.filter(pk=run.pk).update(status=Run.Status.STOPPED)
    card.locator("input[name=score][value='4']").check()
    card.locator("form.rate button[type=submit]").click()
    expect(card.locator("form.rate .errors")).to_have_text(f"run {run.pk} {STOPPED_WORDS}")
    assert not Feedback.objects.filter(run=run).exists()
    # Stopped with its event: the page says the queue is closed and why, and puts it away.
    Run.objects.filter(pk=run.pk).update(status=Run.Status.RUNNING)
    in_a_thread(lambda: run_transition(run=run, action="stop", actor=owner))
    closed = page.locator("#annotate-closed")
    expect(closed).to_be_visible(timeout=BROWSER_WAIT_MS)
    expect(closed).to_contain_text("This run is stopped: it takes no more feedback (it trains nothing until its "
                                   "owner starts it again)")
    expect(page.locator(".queue-col")).to_be_hidden()
    page.reload()
    expect(page.locator("#annotate-closed")).to_contain_text("(it trains nothing until its owner starts it again)")
    expect(page.locator("#queue .item")).to_have_count(0)
