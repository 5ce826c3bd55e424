"""Progress of the whole labelling job (issue 32 item 5, from Argilla / Label Studio): the
owner sees on the run page how much is labelled and how much is left, and per person the
labels given, late and skipped; nobody else sees it."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import User
from django.test import Client

from apps.buffer.models import Experience
from apps.feedback.handout.lease import assignment_claim, assignment_skip
from apps.feedback.kinds.rating import feedback_rate
from apps.runs.models import Run
from tests.factories import add_member, make_experiences, make_run, make_taskset, make_user

pytestmark = pytest.mark.django_db


def signed_in(client: Client, user: User) -> Client:
    client.force_login(user)
    return client


def progress_of(html: str) -> str:
    found = re.search(r'<section id="labelling".*?</section>', html, re.S)
    assert found, "no labelling progress on the page"
    return found.group(0)


def found_in(pattern: str, text: str) -> str:
    match = re.search(pattern, text, re.S)
    assert match, pattern
    return match.group(1)


def person_row(section: str, username: str) -> dict[str, int]:
    row = re.search(rf'<tr data-person="{username}">(.*?)</tr>', section, re.S)
    assert row, f"no row for {username}"
    return {name: int(n) for name, n in re.findall(r'<td class="(labels|late|skipped|leased)">(\d+)</td>', row.group(1))}


@pytest.fixture
def team(owner: User) -> tuple[Run, User, User]:
    run = make_run(owner=owner, taskset=make_taskset(owner=owner), name="rated",
                   # Arrival order: the claims below take exact counts (a rule hands a sibling pair whole).
                   feedback={"mode": "blend", "overlap": 2, "selection": {"uncertainty": 0.0, "random_share": 0.0}})
    annie, bea = make_user("annie"), make_user("bea")
    add_member(run, annie)
    add_member(run, bea)
    return run, annie, bea


def test_the_owner_sees_done_and_remaining_and_each_persons_labels_late_and_skipped(
        client: Client, owner: User, team: tuple[Run, User, User]) -> None:
    run, annie, bea = team
    make_experiences(run, groups=1, group_size=4, status="pending")  # 4 items x overlap 2 = 8 labels to give
    first, second, third = assignment_claim(run=run, annotator=annie, size=3)
    feedback_rate(run=run, author=annie, experience=first.experience, score=4)
    feedback_rate(run=run, author=annie, experience=second.experience, score=2)
    assert assignment_skip(assignment=third)
    [trained] = [e for e in make_experiences(run, groups=1, group_size=1) if e]
    Experience.objects.filter(pk=trained.pk).update(status=Experience.Status.CONSUMED)
    assert feedback_rate(run=run, author=annie, experience=trained.pk, score=5).late  # after its group trained

    section = progress_of(signed_in(client, owner).get(f"/runs/{run.pk}/").content.decode())
    totals = " ".join(re.sub(r"<[^>]+>", "", found_in(r'<p id="labelling-totals">(.*?)</p>', section)).split())
    assert "2 slots done" in totals and "6 to go" in totals  # 3 labels: one late, on an item no queue handed out
    assert person_row(section, "annie") == {"labels": 3, "late": 1, "skipped": 1, "leased": 0}
    assert person_row(section, "bea") == {"labels": 0, "late": 0, "skipped": 0, "leased": 0}  # listed before starting
    assert 'value="25"' in section  # 2 of 8

    # Bea takes two into her queue: still to go, now shown as in her queue.
    assignment_claim(run=run, annotator=bea, size=2)
    section = progress_of(client.get(f"/runs/{run.pk}/").content.decode())
    assert "6</strong> to go (2 in someone's queue)" in section
    assert person_row(section, "bea")["leased"] == 2


def test_annotators_and_viewers_do_not_see_the_jobs_progress(
        client: Client, team: tuple[Run, User, User]) -> None:
    run, annie, _ = team
    html = signed_in(client, annie).get(f"/runs/{run.pk}/").content.decode()
    assert 'id="labelling"' not in html


def test_an_ended_run_has_nothing_left_to_label(client: Client, owner: User, team: tuple[Run, User, User]) -> None:
    run, annie, _ = team
    make_experiences(run, groups=1, group_size=2, status="pending")
    [one, _other] = assignment_claim(run=run, annotator=annie, size=2)
    feedback_rate(run=run, author=annie, experience=one.experience, score=3)
    Run.objects.filter(pk=run.pk).update(status=Run.Status.FINISHED)
    section = progress_of(signed_in(client, owner).get(f"/runs/{run.pk}/").content.decode())
    assert re.search(r"1</strong> <span[^>]*>slots done", section) and "takes no more labels" in section and 'value="100"' in section


def test_a_username_is_escaped(client: Client, owner: User, team: tuple[Run, User, User]) -> None:
    run, _, _ = team
    add_member(run, make_user("<img src=x>"))
    html = signed_in(client, owner).get(f"/runs/{run.pk}/").content.decode()
    assert "<img src=x>" not in progress_of(html) and "&lt;img src=x&gt;" in progress_of(html)
