"""The review of labels over the REST API (issue 32 item 5): the run owner's key lists the labels
and disagreements, rejects and accepts, and resolves a disagreement, through the same services as
the review page; any other key is refused and bad input is named."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from apps.buffer.models import Experience
from apps.envapi.services import api_key_create
from apps.feedback.models import Feedback
from apps.feedback.kinds.rating import feedback_rate
from apps.runs.models import AuditEntry, Run
from tests.envapi.conftest import Api
from tests.factories import add_member, make_experiences, make_run, make_taskset, make_user

pytestmark = pytest.mark.django_db


def key_of(person: User, *runs: Run, actions: tuple[str, ...] = ("read", "feedback")) -> Api:
    _, raw = api_key_create(name=f"{person.username}'s key", runs=runs, actions=list(actions), created_by=person,
                            rate_limit_per_minute=10_000)
    return Api(raw)


@pytest.fixture
def rated(owner: User) -> tuple[Run, Experience, Feedback, Feedback, User]:
    run = make_run(owner=owner, taskset=make_taskset(owner=owner), feedback={"mode": "blend", "overlap": 2})
    annie, bea = make_user("annie"), make_user("bea")
    add_member(run, annie)
    add_member(run, bea)
    [item] = make_experiences(run, groups=1, group_size=1, status="pending", auto_reward=0.0)
    return (run, item, feedback_rate(run=run, experience=item, score=5, author=annie),
            feedback_rate(run=run, experience=item, score=1, author=bea), annie)


def test_the_owners_key_rejects_a_label_and_the_reward_moves(owner: User, rated: tuple[Run, Experience, Feedback, Feedback, User]) -> None:
    run, item, _, beas, _ = rated
    api = key_of(owner, run)
    response = api.post(f"/runs/{run.pk}/review/labels/{beas.pk}/reject")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["label"]["review"] == "rejected" and body["label"]["reviewed_by"] == "owner"
    assert body["label"]["author"] == "bea" and "taken out of its group's reward" in body["effect"]
    assert Experience.objects.get(pk=item.pk).human_reward == 1.0
    assert AuditEntry.objects.filter(run=run, action="label_reject", actor=owner).count() == 1

    listed = api.get(f"/runs/{run.pk}/review/labels", status="rejected").json()
    assert [row["id"] for row in listed] == [beas.pk]
    assert api.post(f"/runs/{run.pk}/review/labels/{beas.pk}/accept").json()["label"]["review"] == "accepted"


def test_the_owners_key_lists_and_resolves_a_disagreement(owner: User, rated: tuple[Run, Experience, Feedback, Feedback, User]) -> None:
    run, item, annies, beas, _ = rated
    api = key_of(owner, run)
    [found] = api.get(f"/runs/{run.pk}/review/disagreements").json()
    assert found["group_id"] == item.group_id and {row["id"] for row in found["labels"]} == {annies.pk, beas.pk}
    assert "annie 5/5, bea 1/5" in found["conflicts"][0]["why"]

    resolved = api.post(f"/runs/{run.pk}/review/disagreements/{item.group_id}/resolve", {"keep": annies.pk}).json()
    assert resolved["kept"]["label"]["id"] == annies.pk
    assert [o["label"]["id"] for o in resolved["rejected"]] == [beas.pk]
    assert api.get(f"/runs/{run.pk}/review/disagreements").json() == []
    again = api.post(f"/runs/{run.pk}/review/disagreements/{item.group_id}/resolve", {"keep": annies.pk})
    assert again.status_code == 409


def test_keys_that_are_not_the_owners_are_refused_and_bad_input_is_named(
        owner: User, rated: tuple[Run, Experience, Feedback, Feedback, User]) -> None:
    run, item, annies, beas, annie = rated
    annies_key = key_of(annie, run)
    refused = annies_key.post(f"/runs/{run.pk}/review/labels/{beas.pk}/reject")
    assert refused.status_code == 403 and "run's owner" in refused.json()["detail"]
    read_only = key_of(owner, run, actions=("read",))
    assert read_only.post(f"/runs/{run.pk}/review/labels/{beas.pk}/reject").status_code == 403
    assert Feedback.objects.get(pk=beas.pk).review == "pending"

    api = key_of(owner, run)
    assert api.post(f"/runs/{run.pk}/review/labels/999999/reject").status_code == 404
    elsewhere = make_run(owner=owner, name="elsewhere")
    assert key_of(owner, elsewhere).post(f"/runs/{run.pk}/review/labels/{beas.pk}/reject").status_code == 404
    bad = api.get(f"/runs/{run.pk}/review/labels", status="maybe")
    assert bad.status_code == 422 and "status" in bad.json()["errors"]
    not_a_side = api.post(f"/runs/{run.pk}/review/disagreements/{item.group_id}/resolve", {"keep": 999999})
    assert not_a_side.status_code == 422 and "keep" in not_a_side.json()["errors"]
    nul = api.get(f"/runs/{run.pk}/review/labels", person="bea\x00")
    assert nul.status_code == 422 and "person" in nul.json()["errors"]
    assert api.post(f"/runs/{run.pk}/review/disagreements/no-such-group/resolve", {"keep": annies.pk}).status_code == 404
