"""The review page of a run (issue 32 item 5), through Django's test client: the owner sees the
labels newest first with filters and their disagreements, accepts and rejects with a plain form
or an HTMX partial; model output is escaped; annotators and viewers are refused. The real
browser is in tests/dashboard/test_review_browser.py."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import User
from django.test import Client

from apps.buffer.models import Experience
from apps.feedback.models import Feedback
from apps.feedback.kinds.pairwise import feedback_compare
from apps.feedback.kinds.rating import feedback_rate
from apps.runs.models import Run, RunMember
from tests.factories import add_member, make_experiences, make_run, make_taskset, make_user

pytestmark = pytest.mark.django_db


def signed_in(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def label_ids(html: str) -> list[int]:
    section = re.search(r'<section id="labels".*?</section>', html, re.S)
    assert section, "no label list on the page"
    return [int(n) for n in re.findall(r'<li class="review-row[^"]*" id="label-(\d+)"', section.group(0))]


@pytest.fixture
def team(owner: User) -> tuple[Run, User, User, User]:
    run = make_run(owner=owner, taskset=make_taskset(owner=owner), name="reviewed",
                   feedback={"mode": "blend", "overlap": 2})
    annie, bea, vic = make_user("annie"), make_user("bea"), make_user("vic")
    add_member(run, annie)
    add_member(run, bea)
    add_member(run, vic, RunMember.Role.VIEWER)
    return run, annie, bea, vic


def test_the_owner_sees_labels_newest_first_and_filters_them(owner: User, team: tuple[Run, User, User, User]) -> None:
    run, annie, bea, _ = team
    first, second = make_experiences(run, groups=1, group_size=2, status="pending", auto_reward=0.0)
    old = feedback_rate(run=run, experience=first, score=4, author=annie)
    far = feedback_rate(run=run, experience=first, score=1, author=bea)
    choice = feedback_compare(run=run, experience=first, other=second, winner="a", author=bea)
    client = signed_in(owner)

    html = client.get(f"/runs/{run.pk}/review/").content.decode()
    assert label_ids(html) == [choice.pk, far.pk, old.pk]
    assert "1</strong> open disagreement" in html and "annie 4/5, bea 1/5" in html
    assert label_ids(client.get(f"/runs/{run.pk}/review/?person=annie").content.decode()) == [old.pk]
    assert label_ids(client.get(f"/runs/{run.pk}/review/?kind=pairwise").content.decode()) == [choice.pk]
    assert label_ids(client.get(f"/runs/{run.pk}/review/?disagreements=1").content.decode()) == [far.pk, old.pk]
    Feedback.objects.filter(pk=old.pk).update(review="accepted")
    assert label_ids(client.get(f"/runs/{run.pk}/review/?status=accepted").content.decode()) == [old.pk]
    assert label_ids(client.get(f"/runs/{run.pk}/review/?status=pending").content.decode()) == [choice.pk, far.pk]
    # A filter that is no state says so, naming it.
    bad = client.get(f"/runs/{run.pk}/review/?status=maybe")
    assert bad.status_code == 400 and "is not a review state" in bad.content.decode()
    # The run page links the owner here.
    assert f'href="/runs/{run.pk}/review/"' in client.get(f"/runs/{run.pk}/").content.decode()


def test_rejecting_with_a_plain_form_comes_back_to_the_page_and_the_reward_moves(
        owner: User, team: tuple[Run, User, User, User]) -> None:
    run, annie, bea, _ = team
    [item] = make_experiences(run, groups=1, group_size=1, status="pending", auto_reward=0.0)
    feedback_rate(run=run, experience=item, score=5, author=annie)
    wrong = feedback_rate(run=run, experience=item, score=1, author=bea)
    assert Experience.objects.get(pk=item.pk).human_reward == 0.5
    client = signed_in(owner)

    response = client.post(f"/runs/{run.pk}/review/labels/{wrong.pk}/reject/", {"person": "bea"})
    assert response.status_code == 302 and response["Location"] == f"/runs/{run.pk}/review/?person=bea"
    page = client.get(response["Location"]).content.decode()
    assert f'id="label-{wrong.pk}" data-feedback="{wrong.pk}" data-review="rejected"' in page
    assert "rejected by owner" in page and "Takes no effect" in page
    assert "taken out of its group&#x27;s reward" in page  # the outcome, once
    assert Experience.objects.get(pk=item.pk).human_reward == 1.0


def test_an_htmx_accept_answers_the_pages_body_with_the_outcome(owner: User, team: tuple[Run, User, User, User]) -> None:
    run, annie, _, _ = team
    [item] = make_experiences(run, groups=1, group_size=1, status="pending", auto_reward=0.0)
    label = feedback_rate(run=run, experience=item, score=3, author=annie)
    response = signed_in(owner).post(f"/runs/{run.pk}/review/labels/{label.pk}/accept/", HTTP_HX_REQUEST="true")
    body = response.content.decode()
    assert response.status_code == 200 and "<html" not in body
    assert 'id="review-message"' in body and f"#{label.pk} accepted" in body
    assert 'data-review="accepted"' in body and "accepted by owner" in body


def test_the_owner_keeps_one_side_of_a_disagreement_from_the_page(owner: User, team: tuple[Run, User, User, User]) -> None:
    run, annie, bea, _ = team
    [item] = make_experiences(run, groups=1, group_size=1, status="pending", auto_reward=0.0)
    keep = feedback_rate(run=run, experience=item, score=5, author=annie)
    drop = feedback_rate(run=run, experience=item, score=1, author=bea)
    client = signed_in(owner)
    response = client.post(f"/runs/{run.pk}/review/groups/{item.group_id}/resolve/", {"keep": keep.pk})
    assert response.status_code == 302
    page = client.get(response["Location"]).content.decode()
    assert f"Kept rating #{keep.pk}; rejected #{drop.pk}" in page and "No open disagreements" in page
    # Nothing left to resolve: the form says so instead of failing.
    again = client.post(f"/runs/{run.pk}/review/groups/{item.group_id}/resolve/", {"keep": keep.pk})
    assert again.status_code == 400 and "no open disagreement" in again.content.decode()


def test_model_output_and_names_are_escaped(owner: User, team: tuple[Run, User, User, User]) -> None:
    run, _, _, _ = team
    rogue = make_user("<b>rogue</b>")
    add_member(run, rogue)
    [item] = make_experiences(run, groups=1, group_size=1, status="pending", auto_reward=0.0,
                              response_text="<script>alert(1)</script><img src=x onerror=alert(2)>")
    feedback_rate(run=run, experience=item, score=2, author=rogue, comment="<i>hi</i>")
    html = signed_in(owner).get(f"/runs/{run.pk}/review/").content.decode()
    assert "<script>alert(1)" not in html and "<img src=x onerror" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html  # shown as text
    assert "<b>rogue</b>" not in html and "&lt;b&gt;rogue&lt;/b&gt;" in html
    assert "<i>hi</i>" not in html


def test_annotators_and_viewers_are_refused_and_outsiders_see_no_run(
        team: tuple[Run, User, User, User]) -> None:
    run, annie, _, vic = team
    [item] = make_experiences(run, groups=1, group_size=1, status="pending", auto_reward=0.0)
    label = feedback_rate(run=run, experience=item, score=2, author=annie)
    for person in (annie, vic):
        client = signed_in(person)
        assert client.get(f"/runs/{run.pk}/review/").status_code == 403
        assert client.post(f"/runs/{run.pk}/review/labels/{label.pk}/reject/").status_code == 403
        assert 'href="/runs/{}/review/"'.format(run.pk) not in client.get(f"/runs/{run.pk}/").content.decode()
    assert signed_in(make_user("outsider")).get(f"/runs/{run.pk}/review/").status_code == 404
    assert Feedback.objects.get(pk=label.pk).review == "pending"


def test_the_annotator_sees_on_their_submissions_that_a_label_was_rejected(
        owner: User, team: tuple[Run, User, User, User]) -> None:
    from apps.feedback.review.services import feedback_reject

    run, annie, _, _ = team
    [item] = make_experiences(run, groups=1, group_size=1, status="pending", auto_reward=0.0)
    label = feedback_rate(run=run, experience=item, score=2, author=annie)
    mine = signed_in(annie)
    assert "rejected on review" not in mine.get(f"/runs/{run.pk}/annotate/mine/").content.decode()
    feedback_reject(run=run, feedback_id=label.pk, reviewer=owner)
    assert "rejected on review" in mine.get(f"/runs/{run.pk}/annotate/mine/").content.decode()
