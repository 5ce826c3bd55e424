"""Blind pairs between annotation items (an evaluation's placement "between", issue 63 item 2),
through Django's client: the annotation page hands out a pair after every third item the
person is given (its live top-ups too), the card is as blind as the vote page, its vote is the
same Vote row, and the person's ledger counts it as "evaluation vote: not trained". Votes
reach nothing of training: feedback, preference pairs, rater reliability, the label ledger and
every training export read the same before and after them. The keyboard at a phone's and a
laptop's width: test_between_browser.py."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import User
from django.test import Client, override_settings

from apps.buffer.models import Experience
from apps.buffer.services import experience_write
from apps.evaluation.models import Evaluation, Vote
from apps.evaluation.services import evaluation_close, evaluation_create
from apps.feedback.training_data import EXPORT_FORMATS, export_rows
from apps.feedback.ledger import run_ledger
from apps.feedback.models import Feedback
from apps.feedback.reward_model.preferences import preference_pairs_read
from apps.feedback.raters.reliability import rater_figures
from apps.runs.models import Run
from kernel.exceptions import InvalidInput
from tests.evaluation.conftest import answer_all, publish
from tests.evaluation.test_vote_page import client_of, leaks
from tests.factories import add_member, experience_row, make_run, make_taskset

pytestmark = pytest.mark.django_db

CARD = re.compile(r'<article class="item blind-item[^"]*" id="blind-([\w-]+)"')
ENTRY = re.compile(r'<article class="item[^"]*" id="((?:item|blind)-[\w-]+)"')


def between_run(owner: User, annotator: User, *, items: int = 6, placement: str = "between") -> tuple[Run, Evaluation]:
    """A run with `items` single completions waiting for a rating, and an open blind evaluation."""
    run = publish(make_run(owner=owner, taskset=make_taskset(owner=owner), name="Zanzibar tutoring run",
                           feedback={"mode": "blend", "w_auto": 0.5, "w_human": 0.5, "overlap": 1}), 1, 2)
    add_member(run, annotator)
    rows = [experience_row(run, key=f"g{i}", group=f"g{i}", status="pending", reward=None, auto_reward=0.5,
                           response_text=f"Completion {i}") for i in range(items)]
    experience_write(experiences=rows)
    evaluation = answer_all(evaluation_create(run=run, by=owner, prompts=[f"Question {i}?" for i in range(4)],
                                              seed=3, votes_per_pair=2, placement=placement))
    return run, evaluation


def card_of(html: str, token: str) -> str:
    return html.split(f'id="blind-{token}"', 1)[1].split("</article>", 1)[0]


def entries(html: str) -> list[str]:
    queue = html.split('<div id="queue">', 1)[1].split('<p id="done-note"', 1)[0]
    return ENTRY.findall(queue)


def test_a_pair_comes_after_every_third_item_and_its_card_is_blind(owner: User, annotator: User) -> None:
    run, evaluation = between_run(owner, annotator)
    c = client_of(annotator)
    page = c.get(f"/runs/{run.pk}/annotate/").content.decode()
    shown = entries(page)
    assert [e.split("-")[0] for e in shown] == ["item"] * 3 + ["blind"] + ["item"] * 3 + ["blind"]
    tokens = [e.split("-", 1)[1] for e in shown if e.startswith("blind-")]
    assert len(set(tokens)) == 2 and set(tokens) <= set(evaluation.items.values_list("token", flat=True))
    for token in tokens:
        card = card_of(page, token)
        assert f'/vote/{evaluation.token}/{token}/' in card and leaks(card, evaluation) == []
        assert all(f'data-key="{k}"' in card for k in "abtx")
    # The annotation page names its run (its items' URLs), never a version.
    assert not re.search(r"\bv[0-2]\b|\bversions?\b", page, flags=re.I)


def test_a_card_votes_as_the_vote_page_does_and_the_ledger_says_not_trained(owner: User, annotator: User) -> None:
    run, evaluation = between_run(owner, annotator)
    c = client_of(annotator)
    token = CARD.findall(c.get(f"/runs/{run.pk}/annotate/").content.decode())[0]
    done = c.post(f"/vote/{evaluation.token}/{token}/", {"choice": "right", "shown_in": "between"},
                  HTTP_HX_REQUEST="true")
    body = done.content.decode()
    assert done.status_code == 200 and f'id="blind-{token}"' in body and "done" in body
    assert "B is better: counted. Evaluation vote: not trained." in body and leaks(body, evaluation) == []
    vote = Vote.objects.get()
    assert (vote.item.token, vote.voter, vote.choice) == (token, annotator, "right")
    # Voted once: the card is not handed out again, and a second vote finishes it with the reason.
    assert token not in CARD.findall(c.get(f"/runs/{run.pk}/annotate/").content.decode())
    again = c.post(f"/vote/{evaluation.token}/{token}/", {"choice": "left", "shown_in": "between"},
                   HTTP_HX_REQUEST="true")
    assert again.status_code == 200 and "not counted: you have already voted on this pair." in again.content.decode()
    bad = c.post(f"/vote/{evaluation.token}/{CARD.findall(c.get(f'/runs/{run.pk}/annotate/').content.decode())[0]}/",
                 {"choice": "middle", "shown_in": "between"}, HTTP_HX_REQUEST="true")
    assert bad.status_code == 400 and "choice" in bad.content.decode()
    # The person's ledger: on the annotation page's "your submissions" and on its own page.
    for url in (f"/runs/{run.pk}/annotate/", f"/runs/{run.pk}/annotate/mine/"):
        html = c.get(url).content.decode()
        assert re.search(r'data-not-trained="evaluation vote">1 evaluation vote: not trained', html), url
    evaluation_close(evaluation=evaluation, by=owner)
    assert CARD.findall(c.get(f"/runs/{run.pk}/annotate/").content.decode()) == []


def test_the_live_top_up_places_cards_as_the_page_does(owner: User, annotator: User) -> None:
    run, evaluation = between_run(owner, annotator, items=12)
    c = client_of(annotator)
    with override_settings(RFT_ANNOTATION_QUEUE_SIZE=3):
        first = entries(c.get(f"/runs/{run.pk}/annotate/").content.decode())
        assert [e.split("-")[0] for e in first] == ["item"] * 3 + ["blind"]
        last = max(int(e.split("-")[1]) for e in first if e.startswith("item-"))
        # Rate the three: the top-up hands out the next three, the person's 4th to 6th items.
        for assignment in (e.split("-")[1] for e in first if e.startswith("item-")):
            c.post(f"/runs/{run.pk}/annotate/items/{assignment}/rate/", {"score": "3"})
        more = c.get(f"/runs/{run.pk}/annotate/queue/?after={last}", HTTP_HX_REQUEST="true").content.decode()
    assert [e.split("-")[0] for e in ENTRY.findall(more)] == ["item"] * 3 + ["blind"]
    assert all(leaks(card_of(more, token), evaluation) == [] for token in CARD.findall(more))


def test_the_default_is_a_page_of_its_own_and_a_bad_placement_is_named(owner: User, annotator: User) -> None:
    run, evaluation = between_run(owner, annotator, placement="page")
    assert evaluation.placement == "page"
    page = client_of(annotator).get(f"/runs/{run.pk}/annotate/").content.decode()
    assert CARD.findall(page) == [] and f"/vote/{evaluation.token}/" in page  # the link to its page
    with pytest.raises(InvalidInput, match="placement") as refused:
        evaluation_create(run=run, by=owner, prompts=["p"], placement="sidebar")
    assert refused.value.field == "placement"
    with override_settings(RFT_ANNOTATION_BETWEEN_EVERY=0):
        Evaluation.objects.update(placement="between")
        assert CARD.findall(client_of(annotator).get(f"/runs/{run.pk}/annotate/").content.decode()) == []


def _training_reads(run: Run) -> object:
    """Everything of training that people's labels reach, as plain values."""
    pairs = preference_pairs_read(run=run)
    ledger = run_ledger(run=run)
    return (Feedback.objects.count(), [repr(p) for p in pairs.pairs], pairs.unpaired,
        [repr(f) for f in rater_figures(run=run)], repr(ledger.run), sorted(ledger.people),
        list(Experience.objects.filter(run=run).order_by("pk").values_list("reward", "human_reward", "status")),
        {fmt: list(export_rows(run=run, export_format=fmt)) for fmt in EXPORT_FORMATS})


def test_votes_reach_no_training_reward_model_reliability_or_export(owner: User, annotator: User) -> None:
    run, evaluation = between_run(owner, annotator)
    c = client_of(annotator)
    page = c.get(f"/runs/{run.pk}/annotate/").content.decode()
    first = next(e for e in entries(page) if e.startswith("item-")).split("-")[1]
    assert c.post(f"/runs/{run.pk}/annotate/items/{first}/rate/", {"score": "4"}).status_code == 302
    before = _training_reads(run)
    for token in CARD.findall(c.get(f"/runs/{run.pk}/annotate/").content.decode()):
        assert c.post(f"/vote/{evaluation.token}/{token}/", {"choice": "left", "shown_in": "between"},
                      HTTP_HX_REQUEST="true").status_code == 200
    owner_client: Client = client_of(owner)
    pair = evaluation.items.exclude(votes__isnull=False).first()
    assert pair is not None
    assert owner_client.post(f"/vote/{evaluation.token}/{pair.token}/", {"choice": "tie"}).status_code == 302
    assert Vote.objects.count() == 3
    assert _training_reads(run) == before
