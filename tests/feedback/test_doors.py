"""One kind of feedback, whichever door it comes through.

An environment (the REST API) and a person (the annotation page) give the same choice, the
same rating and the same ranking to the same group; what each door stores, the rewards the
fold gives, the DPO pairs the trainer takes and the pairs the DPO export writes must be
the same, in the same direction.
"""

from __future__ import annotations

from io import StringIO
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client
from django.urls import reverse

from apps.feedback.training_data import export_rows
from apps.buffer.models import Experience
from apps.buffer.services import experience_write
from apps.feedback.models import Assignment, Feedback
from apps.runs.models import Run
from apps.feedback.selectors import preferences_among
from tests.envapi.conftest import Api, make_key
from tests.factories import add_member, experience_row, make_run

pytestmark = pytest.mark.django_db
HX: dict[str, Any] = {"HTTP_HX_REQUEST": "true"}
TEXTS = ("first answer", "second answer", "third answer")


def _group(run: Run, *, status: str = "pending") -> list[Experience]:
    rows = [experience_row(run, key=f"m{i}", group="g1", response_text=text, reward=None, auto_reward=0.5,
                           status=status) for i, text in enumerate(TEXTS)]
    ids = experience_write(experiences=rows).ids
    return list(Experience.objects.filter(pk__in=ids).order_by("id"))


def _person(run: Run, user: User) -> Client:
    client = Client()
    client.force_login(user)
    client.get(reverse("feedback:page", kwargs={"run_id": run.pk}))  # claims the queue
    return client


def _through_the_api(run: Run, m: list[Experience]) -> None:
    api = Api(make_key(run)[1])
    for body in (
        {"kind": "pairwise", "experience_id": m[1].pk, "other_experience_id": m[2].pk, "winner": "b"},
        {"kind": "rating", "experience_id": m[0].pk, "score": 4},
        {"kind": "ranking", "order": [m[2].pk, m[0].pk, m[1].pk]},
    ):
        response = api.post(f"/runs/{run.pk}/feedback", body)
        assert response.status_code == 200, response.content


def _through_the_page(run: Run, m: list[Experience], user: User) -> None:
    client = _person(run, user)
    compare = reverse("feedback:compare", kwargs={"run_id": run.pk, "experience_id": m[1].pk})
    assert client.post(compare, {"other": m[2].pk, "winner": "b"}, **HX).status_code == 200
    assignment = Assignment.objects.get(run=run, annotator=user, experience=m[0])
    rate = reverse("feedback:rate", kwargs={"run_id": run.pk, "assignment_id": assignment.pk})
    assert client.post(rate, {"score": "4"}, **HX).status_code == 200
    rank = reverse("feedback:rank", kwargs={"run_id": run.pk, "experience_id": m[0].pk})
    ranks = {f"rank_{m[2].pk}": "1", f"rank_{m[0].pk}": "2", f"rank_{m[1].pk}": "3"}
    assert client.post(rank, ranks, **HX).status_code == 200


def _rft(*args: Any) -> str:
    out = StringIO()
    call_command("rft", *[str(a) for a in args], stdout=out, stderr=StringIO())
    return out.getvalue()


def _through_the_cli(run: Run, m: list[Experience], user: User) -> None:
    _rft("feedback", run.pk, "pairwise", "--as", user.username, "--experience", m[1].pk, "--other", m[2].pk,
         "--winner", "b")
    _rft("feedback", run.pk, "rating", "--as", user.username, "--experience", m[0].pk, "--score", 4)
    _rft("feedback", run.pk, "ranking", "--as", user.username, "--order", f"{m[2].pk},{m[0].pk},{m[1].pk}")


def _by_position(m: list[Experience]) -> dict[int, int]:
    return {e.pk: i for i, e in enumerate(m)}


def _outcome(run: Run, m: list[Experience]) -> dict[str, Any]:
    """Everything the feedback changed, with experience ids replaced by their position."""
    pos = _by_position(m)

    def at(pk: int | None) -> int | None:
        return None if pk is None else pos.get(pk)

    stored = []
    for fb in Feedback.objects.filter(run=run).order_by("id"):
        value = dict(fb.value)
        if fb.kind == "ranking":
            value["order"] = [pos[pk] for pk in value["order"]]
        stored.append((fb.kind, at(fb.experience_id), at(fb.other_id), value, fb.late))
    fresh = list(Experience.objects.filter(pk__in=pos).order_by("id"))
    return {
        "stored": stored,
        "rewards": [(e.status, e.human_reward, e.reward) for e in fresh],
        "trained_pairs": [(pos[w], pos[lose]) for w, lose in preferences_among(run=run, ids=list(pos))],
        "exported_pairs": [(row["chosen"][0]["content"], row["rejected"][0]["content"])
                           for row in export_rows(run=run, export_format="dpo")],
    }


def test_the_api_the_annotation_page_and_the_cli_give_the_same_feedback_the_same_effect(
    owner: User, annotator: User
) -> None:
    feedback = {"mode": "blend", "w_auto": 0.5, "w_human": 0.5}
    by_env, by_person, by_cli = (make_run(owner=owner, name=name, feedback=feedback) for name in ("env", "page", "cli"))
    add_member(by_person, annotator)
    add_member(by_cli, annotator)
    env_members, person_members, cli_members = _group(by_env), _group(by_person), _group(by_cli)

    _through_the_api(by_env, env_members)
    _through_the_page(by_person, person_members, annotator)
    _through_the_cli(by_cli, cli_members, annotator)

    env, person, cli = (_outcome(by_env, env_members), _outcome(by_person, person_members),
                        _outcome(by_cli, cli_members))
    assert env == person == cli
    # And what they are: B (third) beats A (second) both in training and in the export.
    assert env["trained_pairs"] == [(2, 1)]
    assert ("third answer", "second answer") in env["exported_pairs"]
    assert env["stored"][1][3] == {"score": 4, "thumb": None, "normalised": 0.75}
    # Rewards: rating 0.75 and Borda 0.5 on the first, 0.0 and 1.0 on the others; blended.
    assert [r[2] for r in env["rewards"]] == pytest.approx([0.5 * 0.5 + 0.5 * 0.625, 0.25, 0.75])
    assert {r[0] for r in env["rewards"]} == {"ready"}


def test_a_person_rates_after_an_environment_rated_the_same_completion(owner: User, annotator: User) -> None:
    run = make_run(owner=owner, feedback={"mode": "human", "overlap": 2})
    add_member(run, annotator)
    members = _group(run)
    api = Api(make_key(run)[1])
    assert api.post(f"/runs/{run.pk}/feedback",
                    {"kind": "rating", "experience_id": members[0].pk, "value": 5}).status_code == 200

    client = _person(run, annotator)
    assignment = Assignment.objects.get(run=run, annotator=annotator, experience=members[0])
    response = client.post(reverse("feedback:rate", kwargs={"run_id": run.pk, "assignment_id": assignment.pk}),
                           {"score": "1"}, **HX)

    assert response.status_code == 200, response.content
    first = Experience.objects.get(pk=members[0].pk)
    # Two raters (the environment's key and the person): final, and the mean of 1.0 and 0.0.
    assert (first.human_reward, first.reward) == (0.5, 0.5)
    assert [fb.value["score"] for fb in Feedback.objects.filter(run=run).order_by("id")] == [5, 1]


def test_late_means_the_same_through_both_doors(owner: User, annotator: User) -> None:
    run = make_run(owner=owner, feedback={"mode": "blend"})
    add_member(run, annotator)
    members = _group(run, status="ready")
    Experience.objects.filter(pk=members[0].pk).update(status="filtered", filter_reason="test: dropped")
    api = Api(make_key(run)[1])
    env = api.post(f"/runs/{run.pk}/feedback", {"kind": "rating", "experience_id": members[0].pk, "score": 3})
    person = Client()
    person.force_login(annotator)
    # A dropped experience is not in anyone's queue; the person ranks its group instead.
    rank = reverse("feedback:rank", kwargs={"run_id": run.pk, "experience_id": members[1].pk})
    ranked = person.post(rank, {f"rank_{m.pk}": str(i + 1) for i, m in enumerate(members)}, **HX)
    assert env.status_code == ranked.status_code == 200
    assert env.json()["late"] is True
    assert [fb.late for fb in Feedback.objects.filter(run=run).order_by("id")] == [True, True]
    assert {e.human_reward for e in Experience.objects.filter(pk__in=[m.pk for m in members])} == {None}


def test_feedback_from_the_cli_that_does_not_fit_is_a_message_and_stores_nothing(owner: User, annotator: User,
                                                                                  outsider: User) -> None:
    run = make_run(owner=owner, feedback={"mode": "human"})
    add_member(run, annotator)
    members = _group(run)
    with pytest.raises(CommandError, match="a whole number from 1 to 5"):
        _rft("feedback", run.pk, "rating", "--as", "annotator", "--experience", members[0].pk, "--score", 9)
    with pytest.raises(CommandError, match="order: a ranking orders every completion of the group"):
        _rft("feedback", run.pk, "ranking", "--as", "annotator", "--order", f"{members[0].pk},{members[1].pk}")
    with pytest.raises(CommandError, match="may not give feedback"):
        _rft("feedback", run.pk, "rating", "--as", "outsider", "--experience", members[0].pk, "--score", 3)
    assert not Feedback.objects.exists()
