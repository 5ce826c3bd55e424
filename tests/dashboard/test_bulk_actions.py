"""Bulk actions in the experience browser (issue 32 item 5, Argilla style): the owner ticks
experiences, or takes every one matching the filter, and excludes them from training,
includes them again, flags or exports them, after a confirmation that shows the count. Each
action is one service (apps/feedback/bulk.py) behind the page and the API; what the owner's
role allows is checked in the service. The effect is what the trainer's reader claims and
what the export holds."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth.models import User
from django.test import Client

from apps.buffer.models import Experience
from apps.buffer.ports import TrainSource
from apps.envapi.services import api_key_create
from apps.feedback.bulk import bulk_ids, experiences_exclude, experiences_export, experiences_flag, experiences_include
from apps.feedback.models import Feedback
from apps.runs.models import AuditEntry, Run, RunMember
from apps.runs.ports import run_view_of
from kernel.exceptions import InvalidInput, NotAllowed
from tests.envapi.conftest import Api
from tests.factories import add_member, make_experiences, make_run, make_taskset, make_user

pytestmark = pytest.mark.django_db


def ids(rows: list[Experience]) -> list[int]:
    return [e.pk for e in rows]


def claimed_by_the_trainer(run: Run) -> set[int]:
    return {e.pk for e in TrainSource.claim(run=run_view_of(run), worker="trainer-1", size=100)}


def signed_in(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_what_the_owner_excludes_the_trainer_never_claims_and_what_she_includes_again_it_does(
        owner: User, run: Run) -> None:
    rows = make_experiences(run, groups=2, group_size=4)
    out = rows[:3]
    result = experiences_exclude(run=run, user=owner, ids=ids(out))
    assert (result.count, result.skipped) == (3, 0)
    assert AuditEntry.objects.filter(run=run, action="bulk_exclude", actor=owner).exists()
    assert claimed_by_the_trainer(run) == set(ids(rows[3:]))

    TrainSource.release(run=run_view_of(run), worker="trainer-1")
    back = experiences_include(run=run, user=owner, ids=ids(out))
    assert back.count == 3
    assert claimed_by_the_trainer(run) == set(ids(rows))


def test_an_experience_waiting_for_people_stays_out_when_their_rating_arrives_and_returns_to_waiting(
        owner: User, annotator: User, run: Run) -> None:
    from apps.feedback.kinds.rating import feedback_rate

    run.config = {**run.config, "feedback": {"mode": "human"}}
    run.save(update_fields=["config"])
    rows = make_experiences(run, groups=1, group_size=2, status="pending")
    experiences_exclude(run=run, user=owner, ids=[rows[0].pk])
    feedback_rate(run=run, experience=rows[1], score=5, author=annotator)
    feedback_rate(run=run, experience=rows[0], score=1, author=annotator)
    rows[0].refresh_from_db()
    assert rows[0].status == "filtered" and rows[0].filter_reason == "excluded (pending) by owner"
    experiences_include(run=run, user=owner, ids=[rows[0].pk])
    rows[0].refresh_from_db()
    assert rows[0].status == "pending"


def test_rows_already_in_a_batch_are_left_and_counted_and_pipeline_filtered_rows_are_not_a_persons_to_include(
        owner: User, run: Run) -> None:
    rows = make_experiences(run, groups=1, group_size=4)
    claimed = claimed_by_the_trainer(run)
    assert claimed == set(ids(rows))
    result = experiences_exclude(run=run, user=owner, ids=ids(rows))
    assert (result.count, result.skipped) == (0, 4) and "training batch" in result.why_skipped
    dropped = make_experiences(run, groups=1, group_size=1, status="filtered", filter_reason="too_long")
    assert experiences_include(run=run, user=owner, ids=ids(dropped)).count == 0


def test_an_annotator_may_flag_and_export_but_not_exclude_and_a_viewer_may_only_export(
        owner: User, annotator: User, run: Run) -> None:
    viewer = make_user("viewer")
    add_member(run, viewer, role=RunMember.Role.VIEWER)
    rows = make_experiences(run, groups=1, group_size=3)
    with pytest.raises(NotAllowed):
        experiences_exclude(run=run, user=annotator, ids=ids(rows))
    with pytest.raises(NotAllowed):
        experiences_flag(run=run, user=viewer, ids=ids(rows))
    flagged = experiences_flag(run=run, user=annotator, ids=ids(rows[:2]), reason="wrong units")
    assert flagged.count == 2
    assert experiences_flag(run=run, user=annotator, ids=ids(rows[:2])).skipped == 2  # not twice
    assert Feedback.objects.filter(run=run, kind="flag", author=annotator).count() == 2
    lines = [json.loads(line) for line in experiences_export(run=run, user=viewer, ids=ids(rows[1:]))]
    assert [r["id"] for r in lines] == ids(rows[1:])
    assert [r["flagged"] for r in lines] == [True, False]


def test_the_owner_ticks_two_rows_confirms_the_count_and_the_export_holds_exactly_those(owner: User, run: Run) -> None:
    rows = make_experiences(run, groups=2, group_size=3, response_text="<b>bold</b> answer")
    client = signed_in(owner)
    page = client.get(f"/runs/{run.pk}/experiences/").content.decode()
    assert f'name="ids" value="{rows[0].pk}"' in page and "all 6 matching the filter" in page
    chosen = [str(rows[1].pk), str(rows[4].pk)]
    confirm = client.post(f"/runs/{run.pk}/experiences/bulk/", {"action": "export", "ids": chosen})
    assert confirm.status_code == 200
    assert 'data-count="2"' in confirm.content.decode() and "Export 2 experience(s) as JSONL?" in confirm.content.decode()
    download = client.post(f"/runs/{run.pk}/experiences/bulk/", {"action": "export", "ids": chosen, "confirm": "yes"})
    assert download["Content-Type"].startswith("application/jsonl")
    exported = [json.loads(line) for line in download.getvalue().decode().splitlines()]
    assert [r["id"] for r in exported] == sorted(int(i) for i in chosen)
    assert exported[0]["response_text"] == "<b>bold</b> answer"


def test_all_matching_the_filter_excludes_every_page_of_it_and_nothing_else(owner: User, run: Run) -> None:
    rows = make_experiences(run, groups=30, group_size=4)  # 120 rows: more than a page of 50
    high = [e for e in rows if (e.reward or 0) >= 2]
    client = signed_in(owner)
    form = {"action": "exclude", "scope": "filter", "reward_min": "2"}
    confirm = client.post(f"/runs/{run.pk}/experiences/bulk/", form).content.decode()
    assert f'data-count="{len(high)}"' in confirm
    done = client.post(f"/runs/{run.pk}/experiences/bulk/", {**form, "confirm": "yes"}, follow=True)
    assert f"Exclude from training: {len(high)} experiences." in done.content.decode()
    assert set(Experience.objects.filter(run=run, status="filtered").values_list("pk", flat=True)) == set(ids(high))


def test_bad_selections_are_refused_naming_the_problem(owner: User, annotator: User, run: Run) -> None:
    other = make_run(owner=owner, taskset=make_taskset(owner=owner), name="other")
    theirs = make_experiences(other, groups=1, group_size=1)
    make_experiences(run, groups=1, group_size=1)
    client = signed_in(owner)
    url = f"/runs/{run.pk}/experiences/bulk/"
    nothing = client.post(url, {"action": "exclude"})
    assert nothing.status_code == 422 and "select at least one experience" in nothing.content.decode()
    foreign = client.post(url, {"action": "exclude", "ids": [str(theirs[0].pk)]})
    assert foreign.status_code == 422 and f"not experiences of run {run.pk}" in foreign.content.decode()
    assert client.post(url, {"action": "delete", "ids": ["1"]}).status_code == 422
    assert client.post(url, {"action": "exclude", "ids": ["1; drop"]}).status_code == 422
    refused = signed_in(annotator).post(url, {"action": "exclude", "ids": [str(theirs[0].pk)]})
    assert refused.status_code == 403
    assert signed_in(make_user("stranger")).post(url, {"action": "export", "ids": ["1"]}).status_code == 404
    with pytest.raises(InvalidInput, match="at least one"):
        bulk_ids(run=run, ids=[])


def test_the_api_door_acts_as_the_keys_person(owner: User, annotator: User, run: Run) -> None:
    rows = make_experiences(run, groups=1, group_size=3)
    _, owners = api_key_create(name="owner's", runs=[run], actions=["read", "feedback"], created_by=owner)
    _, annotators = api_key_create(name="annotator's", runs=[run], actions=["read", "feedback"], created_by=annotator)
    path = f"/runs/{run.pk}/experiences/bulk"
    refused = Api(annotators).post(path, {"action": "exclude", "ids": ids(rows)})
    assert refused.status_code == 403 and "owner" in refused.json()["detail"]
    done = Api(owners).post(path, {"action": "exclude", "ids": ids(rows[:2])})
    assert done.status_code == 200 and done.json() == {"action": "exclude", "count": 2, "skipped": 0, "why_skipped": ""}
    assert claimed_by_the_trainer(run) == {rows[2].pk}
    exported = Api(annotators).post(path, {"action": "export", "ids": [rows[0].pk]})
    lines = exported.getvalue().decode().splitlines()
    assert [json.loads(line)["status"] for line in lines] == ["filtered"]
    bad = Api(owners).post(path, {"action": "exclude", "ids": []})
    assert bad.status_code == 422 and "ids" in bad.json()["errors"]
