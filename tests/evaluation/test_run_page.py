"""The run page, its summary and the annotation page show the blind evaluations: the figures
(recomputed here from the vote rows), a link to the vote page for those with pairs waiting, and
the owner's form to ask for one, close it and download its votes."""

from __future__ import annotations

import json
import re

import pytest
from django.contrib.auth.models import User
from django.test import Client

from apps.evaluation.models import Evaluation, Vote
from apps.runs.models import Run
from tests.evaluation.conftest import MakeEvaluation, answer_all, publish

pytestmark = pytest.mark.django_db


def client_of(user: User) -> Client:
    c = Client()
    c.force_login(user)
    return c


def test_the_run_page_shows_the_figures_from_the_votes(make_evaluation: MakeEvaluation, owner: User,
                                                       annotator: User) -> None:
    evaluation = make_evaluation(prompts=4)
    pairs = list(evaluation.items.filter(is_check=False).select_related("left", "right"))
    for item, choice in zip(pairs, ["left", "left", "right", "tie"]):
        Vote.objects.create(item=item, voter=annotator, choice=choice)
    judged = Vote.objects.filter(item__evaluation=evaluation).select_related("item__left", "item__right")
    wins = sum(1.0 if v.choice in ("left", "right") and getattr(v.item, v.choice).number == 2 else
               0.5 if v.choice == "tie" else 0.0 for v in judged)
    html = client_of(owner).get(f"/runs/{evaluation.run_id}/").content.decode()
    section = html[html.index('id="blind-evaluations"'):]
    row = re.search(r'data-version="v2".*?data-figure="win-rate">([\d.]+)<.*?data-figure="verdict">([^<]+)<', section, re.S)
    assert row is not None and float(row.group(1)) == pytest.approx(wins / 4, abs=5e-4)
    assert row.group(2) == "too few votes to tell"
    assert 'data-figure="left-share">{:.3f}'.format(2 / 3) in section
    assert f"/vote/{evaluation.token}/" in section  # the owner has the check (and a pair) left
    assert "Evaluation votes: not trained" in section

    mine = client_of(annotator).get(f"/runs/{evaluation.run_id}/annotate/").content.decode()
    assert f'href="/vote/{evaluation.token}/"' in mine  # the check waits for the annotator


def test_the_owner_asks_closes_and_downloads_from_the_run_page(run: Run, owner: User, annotator: User) -> None:
    publish(run, 1, 3)
    c = client_of(owner)
    refused = c.post(f"/runs/{run.pk}/evaluations/", {"versions": "0,9"}, follow=True)
    assert "No evaluation: run" in refused.content.decode() and Evaluation.objects.count() == 0
    # No evaluation taskset and no prompts: named, nothing made.
    said = c.post(f"/runs/{run.pk}/evaluations/", {"versions": "", "prompt_count": "5"}, follow=True).content.decode()
    assert "no evaluation taskset" in said
    assert client_of(annotator).post(f"/runs/{run.pk}/evaluations/", {}).status_code == 403

    from apps.evaluation.services import evaluation_create

    evaluation = answer_all(evaluation_create(run=run, by=owner, prompts=["p1", "p2"], seed=1))
    item = evaluation.items.first()
    assert item is not None
    Vote.objects.create(item=item, voter=annotator, choice="right", comment="ok")
    lines = b"".join(c.get(f"/runs/{run.pk}/evaluations/{evaluation.pk}/votes.jsonl").streaming_content)  # type: ignore[attr-defined]
    [record] = [json.loads(line) for line in lines.decode().splitlines()]
    assert record["voter"] == "annotator" and record["choice"] == "right" and record["comment"] == "ok"
    assert client_of(annotator).get(f"/runs/{run.pk}/evaluations/{evaluation.pk}/votes.jsonl").status_code == 403
    c.post(f"/runs/{run.pk}/evaluations/{evaluation.pk}/close/")
    evaluation.refresh_from_db()
    assert evaluation.status == "closed"


def test_the_owners_form_chooses_a_page_of_its_own_or_between_annotation_items(owner: User) -> None:
    from tests.factories import make_run, make_taskset

    evalset = make_taskset(4, owner=owner, name="held-out")
    run = publish(make_run(owner=owner, taskset=make_taskset(owner=owner), eval={"taskset": evalset.pk}), 1)
    c = client_of(owner)
    form = c.get(f"/runs/{run.pk}/").content.decode()
    assert '<option value="page" selected>on a vote page of its own</option>' in form
    assert '<option value="between">between annotation items too</option>' in form
    c.post(f"/runs/{run.pk}/evaluations/", {"prompt_count": "2"})
    c.post(f"/runs/{run.pk}/evaluations/", {"prompt_count": "2", "placement": "between"})
    assert list(Evaluation.objects.order_by("pk").values_list("placement", flat=True)) == ["page", "between"]
    said = c.post(f"/runs/{run.pk}/evaluations/", {"prompt_count": "2", "placement": "aside"}, follow=True)
    assert "No evaluation: placement must be one of page, between" in said.content.decode()
    assert "also between annotation items" in c.get(f"/runs/{run.pk}/").content.decode()


def test_an_ended_run_offers_judging_it_against_its_start_and_its_twins_newest(owner: User) -> None:
    from apps.control.twins import run_twin_create
    from apps.runs.services import run_transition
    from tests.factories import make_run, make_taskset

    run = publish(make_run(owner=owner, taskset=make_taskset(owner=owner)), 1, 4)
    twin = publish(run_twin_create(run=run, actor=owner), 3)
    run_transition(run=run, action="start")
    run_transition(run=run, action="stop")
    html = client_of(owner).get(f"/runs/{run.pk}/").content.decode()
    assert "Judge it yourself: the starting model against the newest and the newest of its twin" in html
    assert f'name="versions" value="0,4,{twin.pk}:3"' in html
