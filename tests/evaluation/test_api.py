"""Blind evaluations through the REST API: the owner's key asks for one, a person's key takes
the next pair (no version named) and votes, the figures and the JSON-lines export read the
votes; a run the key's person cannot see is 404, a closed evaluation 409."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth.models import User

from apps.envapi.services import api_key_create
from apps.evaluation.models import Evaluation, Vote
from apps.runs.models import Run, RunMember
from tests.envapi.conftest import Api
from tests.evaluation.conftest import answer_all, publish

pytestmark = pytest.mark.django_db


def key_of(person: User, *runs: Run, actions: tuple[str, ...] = ("read", "feedback")) -> Api:
    _, raw = api_key_create(name=f"{person.username}'s key", runs=runs, actions=list(actions), created_by=person,
                            rate_limit_per_minute=10_000)
    return Api(raw)


def test_create_vote_figures_export_and_close_through_the_api(run: Run, owner: User, annotator: User) -> None:
    publish(run, 1, 2)
    owners, annotators = key_of(owner, run), key_of(annotator, run)
    made = owners.post(f"/runs/{run.pk}/evaluations", {"prompts": ["two plus two?", "a haiku"], "seed": 5})
    assert made.status_code == 200, made.content
    body = made.json()
    assert body["status"] == "generating" and body["versions"] == ["v0", "v2"] and body["seed"] == 5
    assert body["placement"] == "page"  # the default: a vote page of its own
    between = owners.post(f"/runs/{run.pk}/evaluations", {"prompts": ["p"], "placement": "between"})
    assert between.status_code == 200 and between.json()["placement"] == "between"
    Evaluation.objects.filter(pk=between.json()["id"]).delete()
    refused = owners.post(f"/runs/{run.pk}/evaluations", {"prompts": ["p"], "placement": "sidebar"})
    assert refused.status_code == 422 and "placement" in refused.content.decode()
    evaluation = Evaluation.objects.get(pk=body["id"])
    base = f"/runs/{run.pk}/evaluations/{evaluation.pk}"
    assert annotators.post(f"{base}/votes", {"token": "x", "choice": "a"}).status_code == 409  # not open yet
    answer_all(evaluation)
    assert [e["status"] for e in owners.get(f"/runs/{run.pk}/evaluations").json()] == ["open"]

    choices = iter(["a", "b", "tie", "both_bad"])
    while (shown := annotators.get(f"{base}/next").json())["item"] is not None:
        item = shown["item"]
        assert set(item) == {"token", "prompt", "a", "b"} and "v2" not in json.dumps(item)
        voted = annotators.post(f"{base}/votes", {"token": item["token"], "choice": next(choices), "comment": "ok"})
        assert voted.status_code == 200, voted.content
    assert shown["progress"] == {"done": 3, "total": 3}
    assert annotators.post(f"{base}/votes", {"token": item["token"], "choice": "a"}).status_code == 409
    assert annotators.post(f"{base}/votes", {"token": "nope", "choice": "a"}).status_code == 404
    assert annotators.post(f"{base}/votes", {"token": "x", "choice": "middle"}).status_code == 422

    figures = owners.get(f"{base}/figures").json()
    judged = Vote.objects.filter(item__evaluation=evaluation, item__is_check=False)
    assert figures["votes"] == judged.count() == 2 and figures["checks"] == 1
    [rate] = figures["win_rates"]
    wins = sum(1.0 if v.choice in ("left", "right") and getattr(v.item, v.choice).number == 2 else
               0.5 if v.choice in ("tie", "both_bad") else 0.0 for v in judged.select_related("item__left", "item__right"))
    assert rate["rate"] == pytest.approx(wins / 2) and rate["verdict"] == "too few votes to tell"

    lines = b"".join(owners.get(f"{base}/votes.jsonl").streaming_content).decode().splitlines()
    records = [json.loads(line) for line in lines]
    assert len(records) == 3 and {r["voter"] for r in records} == {"annotator"}
    assert {r["choice"] for r in records} == {"left", "right", "tie"}
    assert all(r["comment"] == "ok" for r in records)
    assert annotators.get(f"{base}/votes.jsonl").status_code == 403  # everyone's choices: the owner's

    closed = owners.post(f"{base}/close")
    assert closed.status_code == 200 and closed.json()["status"] == "closed"
    assert owners.post(f"{base}/close").status_code == 409
    assert annotators.post(f"/runs/{run.pk}/evaluations/{evaluation.pk}/close").status_code == 403


def test_a_person_who_lost_access_and_other_runs_keys_get_404(run: Run, owner: User, annotator: User,
                                                              outsider: User) -> None:
    publish(run, 1)
    evaluation = Evaluation.objects.get(pk=key_of(owner, run).post(f"/runs/{run.pk}/evaluations",
                                                                   {"prompts": ["p"]}).json()["id"])
    answer_all(evaluation)
    base = f"/runs/{run.pk}/evaluations/{evaluation.pk}"
    annotators = key_of(annotator, run)
    token = annotators.get(f"{base}/next").json()["item"]["token"]
    RunMember.objects.filter(user=annotator).delete()
    refused = annotators.post(f"{base}/votes", {"token": token, "choice": "a"})
    assert refused.status_code == 404 and refused.json()["code"] == "not_found"
    assert annotators.get(f"{base}/next").status_code == 404
    # A key not scoped to the run: the same 404 as a run that does not exist.
    other = key_of(outsider, publish(Run.objects.create(name="o", owner=outsider, config=run.config), 1))
    assert other.post(f"{base}/votes", {"token": token, "choice": "a"}).status_code == 404
    assert other.get(f"{base}/figures").status_code == 404
    assert Vote.objects.count() == 0
