"""A run and its twin (issue #46 item 4): the run copied with people's feedback off is linked as
its twin, and the run page and the summary of either show each run's gain in every preference
share both evaluated and the difference, computed from the metric rows."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import User
from django.test import Client

from apps.control.twins import run_twin_create, run_twin_pair, share_gains
from apps.runs.metrics import metric_record
from apps.runs.models import Run
from apps.runs.services import run_transition
from tests.factories import add_member, make_run, make_taskset

pytestmark = pytest.mark.django_db

WORKING = "eval/preference/working"
CONCISE = "eval/preference/concise"


def test_the_gains_and_their_difference_come_from_each_runs_first_and_last_evaluation() -> None:
    # Rows in no particular order; a share only one run measured and other metrics are left out.
    people = [(WORKING, 6, 0.8), (WORKING, 2, 0.3), (WORKING, 4, 0.9), (CONCISE, 2, 0.5), (CONCISE, 6, 0.25),
              ("eval/preference/in_words", 2, 0.1), ("eval/accuracy", 2, 0.9)]
    twin = [(WORKING, 2, 0.35), (WORKING, 6, 0.45), (CONCISE, 6, 0.2), (CONCISE, 2, 0.5), ("eval/accuracy", 6, 0.5)]
    gains = {g.name: g for g in share_gains(people=people, twin=twin)}
    assert sorted(gains) == [CONCISE, WORKING]
    working = gains[WORKING]
    assert (working.people_start, working.people_end, working.twin_start, working.twin_end) == (0.3, 0.8, 0.35, 0.45)
    assert working.people_gain == pytest.approx(0.5)
    assert working.twin_gain == pytest.approx(0.1)
    assert working.difference == pytest.approx(0.4)
    assert gains[CONCISE].difference == pytest.approx(-0.25 - -0.3)
    assert working.label == "preference share: working"


@pytest.fixture
def pair(owner: User) -> tuple[Run, Run]:
    people = make_run(owner=owner, taskset=make_taskset(owner=owner), name="taught")
    twin = run_twin_create(run=people, actor=owner)
    for run, values in ((people, ((2, 0.30), (4, 0.70), (6, 0.75))), (twin, ((2, 0.32), (6, 0.42)))):
        for step, share in values:
            metric_record(run=run, step=step, values={WORKING: share})
    return people, twin


def test_a_twin_copies_the_run_and_is_linked_from_either_side(pair: tuple[Run, Run], owner: User) -> None:
    people, twin = pair
    assert twin.name == "taught (without people)" and twin.config == people.config
    assert twin.taskset_id == people.taskset_id and twin.status == Run.Status.DRAFT
    assert run_twin_pair(run=people) == (people, twin)
    assert run_twin_pair(run=twin) == (people, twin)
    assert run_twin_pair(run=make_run(owner=owner, name="alone")) is None


def twin_of(html: str) -> str:
    match = re.search(r'<div class="twin-comparison" id="twin".*?</tbody>', html, re.S)
    assert match, "no twin comparison on the page"
    return match.group(0)


def figures(html: str) -> dict[str, str]:
    return dict(re.findall(r'data-figure="([a-z-]+)">(?:<strong>)?([^<]*)', twin_of(html)))


def test_both_run_pages_show_the_gains_and_the_difference(pair: tuple[Run, Run], owner: User) -> None:
    people, twin = pair
    client = Client()
    client.force_login(owner)
    for run in (people, twin):
        html = client.get(f"/runs/{run.pk}/").content.decode()
        assert figures(html) == {"people-gain": "+0.450", "twin-gain": "+0.100", "difference": "+0.350"}, twin_of(html)
        assert "0.300 → 0.750" in twin_of(html) and "0.320 → 0.420" in twin_of(html)
    assert f'href="/runs/{twin.pk}/"' in twin_of(client.get(f"/runs/{people.pk}/").content.decode())
    assert "This run is the twin of" in twin_of(client.get(f"/runs/{twin.pk}/").content.decode())
    assert 'id="twin"' not in client.get(f"/runs/{make_run(owner=owner, name='alone').pk}/").content.decode()


def test_the_summary_shows_the_comparison_once_the_run_ended(pair: tuple[Run, Run], owner: User) -> None:
    people, _ = pair
    run_transition(run=people, action="start", actor=owner)
    run_transition(run=Run.objects.get(pk=people.pk), action="finish")
    client = Client()
    client.force_login(owner)
    page = client.get(f"/runs/{people.pk}/").content.decode()
    assert page.count('id="twin"') == 1  # inside the summary, not beside it too
    summary = client.get(f"/runs/{people.pk}/summary/").content.decode()
    assert figures(summary)["difference"] == "+0.350"


def test_a_twin_the_viewer_may_not_see_is_not_named(pair: tuple[Run, Run], annotator: User) -> None:
    people, twin = pair
    add_member(people, annotator)  # of the people run only
    client = Client()
    client.force_login(annotator)
    html = client.get(f"/runs/{people.pk}/").content.decode()
    assert 'id="twin"' not in html and twin.name not in html


def test_the_owner_makes_a_twin_from_the_run_page_and_lands_on_it(owner: User, annotator: User) -> None:
    people = make_run(owner=owner, taskset=make_taskset(owner=owner), name="taught", feedback={"mode": "blend"})
    add_member(people, annotator)
    client = Client()
    client.force_login(owner)
    page = client.get(f"/runs/{people.pk}/").content.decode()
    assert f'href="/runs/{people.pk}/twin/"' in page  # the door, on the owner's run page
    assert 'action="/runs/%d/twin/"' % people.pk in client.get(f"/runs/{people.pk}/twin/").content.decode()
    response = client.post(f"/runs/{people.pk}/twin/")
    twin = Run.objects.exclude(pk=people.pk).get()
    assert response.status_code == 302 and response["Location"] == f"/runs/{twin.pk}/"
    assert run_twin_pair(run=people) == (people, twin) and twin.config == people.config
    assert not twin.members.exists()  # nobody but the owner: nobody rates it
    twin_page = client.get(f"/runs/{twin.pk}/").content.decode()
    assert "copied without people" in twin_page and f'href="/runs/{twin.pk}/twin/"' not in twin_page
    # Not a door for an annotator of the run, nor for a run that takes no people's feedback.
    other = Client()
    other.force_login(annotator)
    assert f'/runs/{people.pk}/twin/' not in other.get(f"/runs/{people.pk}/").content.decode()
    assert other.post(f"/runs/{people.pk}/twin/").status_code in (403, 404)
    assert Run.objects.count() == 2
    auto = make_run(owner=owner, name="automatic", feedback={"mode": "auto"})
    assert f'/runs/{auto.pk}/twin/' not in client.get(f"/runs/{auto.pk}/").content.decode()
