"""The blind vote page through Django's client: a pair, no version/step/run id in it, a vote
moves on; a person who cannot see the run gets 404, a closed evaluation refuses with 409.
Model output is escaped. The keyboard and the network are read in test_vote_browser.py."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import User
from django.test import Client

from apps.evaluation.models import Evaluation, Vote
from apps.evaluation.services import evaluation_close
from tests.evaluation.conftest import MakeEvaluation, answer_all

pytestmark = pytest.mark.django_db


def client_of(user: User) -> Client:
    c = Client()
    c.force_login(user)
    return c


def leaks(html: str, evaluation: Evaluation) -> list[str]:
    """Whatever in `html` could tell the versions apart or name the run."""
    found = []
    entrants = list(evaluation.entrants.all())
    for pattern in [rf"\bv{e.number}\b" for e in entrants] + [rf"/runs/{evaluation.run_id}\b",
                                                               rf"\brun[ _-]?{evaluation.run_id}\b", r"\bstep\b",
                                                               r"\bversion\b"]:
        found += re.findall(pattern, html, flags=re.I)
    return found


def test_the_page_shows_a_blind_pair_and_a_vote_moves_on(make_evaluation: MakeEvaluation, annotator: User) -> None:
    evaluation = make_evaluation(prompts=3)
    c = client_of(annotator)
    page = c.get(f"/vote/{evaluation.token}/")
    html = page.content.decode()
    assert page.status_code == 200 and "1 of 4" in html
    assert leaks(html, evaluation) == []
    item = evaluation.items.get(token=re.search(rf"/vote/{evaluation.token}/([\w-]+)/", html).group(1))  # type: ignore[union-attr]
    assert html.count("answer ") >= 2  # the made-up answers (conftest)
    voted = c.post(f"/vote/{evaluation.token}/{item.token}/", {"choice": "tie", "comment": "close"}, HTTP_HX_REQUEST="true")
    assert voted.status_code == 200 and "2 of 4" in voted.content.decode()
    assert leaks(voted.content.decode(), evaluation) == []
    assert Vote.objects.get().choice == "tie"
    again = c.post(f"/vote/{evaluation.token}/{item.token}/", {"choice": "left"})
    assert again.status_code == 409


def test_model_output_is_escaped(run: object, owner: User, annotator: User, make_evaluation: MakeEvaluation) -> None:
    from apps.evaluation.services import evaluation_create
    from apps.runs.models import Run

    the_run = Run.objects.get()
    evaluation = answer_all(evaluation_create(run=the_run, by=owner, prompts=["<b>p</b>"], seed=1),
                            text=lambda *_: '<script>alert("x")</script><img src=x onerror=alert(1)>')
    html = client_of(annotator).get(f"/vote/{evaluation.token}/").content.decode()
    assert "<script>alert" not in html and "<img" not in html and "<b>p</b>" not in html
    assert "&lt;script&gt;alert" in html and "&lt;b&gt;p&lt;/b&gt;" in html


def test_outsiders_get_404_and_a_closed_evaluation_409(make_evaluation: MakeEvaluation, owner: User,
                                                       annotator: User, outsider: User) -> None:
    evaluation = make_evaluation(prompts=2)
    item = evaluation.items.first()
    assert item is not None
    assert client_of(outsider).get(f"/vote/{evaluation.token}/").status_code == 404
    assert client_of(outsider).post(f"/vote/{evaluation.token}/{item.token}/", {"choice": "left"}).status_code == 404
    assert client_of(annotator).get("/vote/not-a-token/").status_code == 404
    evaluation_close(evaluation=evaluation, by=owner)
    refused = client_of(annotator).post(f"/vote/{evaluation.token}/{item.token}/", {"choice": "left"})
    assert refused.status_code == 409 and "closed" in refused.content.decode()
    assert "This evaluation is closed" in client_of(annotator).get(f"/vote/{evaluation.token}/").content.decode()
