"""A kind of feedback is one declaration (its typed value, target, fold, pairs, API door) and
one service, each registered under its name: the service stores it, the policy folds it into
members' human rewards, the reward model gets its preference pairs, the learned policy counts
it as a label, and the environment API accepts and describes it — no other file names it.

The persona here is a researcher whose raters say only whether an answer is too long, too
short or right ("length"), and who wants that to steer training like a rating does."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from apps.buffer.models import Experience
from apps.buffer.services import experience_write
from apps.envapi.services import api_key_create
from apps.feedback import kinds as registry
from apps.feedback.kinds import FeedbackKind, KindValue, Who, kind_get, kind_register, kind_service
from apps.feedback.learned import run_label_count
from apps.feedback.models import Feedback
from apps.feedback.preferences import preference_pairs
from apps.feedback.services import feedback_store
from kernel.feedback_policy import Signal
from apps.runs.models import Run
from kernel.exceptions import InvalidInput
from tests.factories import add_member, experience_row, make_run

pytestmark = pytest.mark.django_db

VERDICTS = ("too_short", "right", "too_long")


@dataclass(frozen=True)
class LengthValue(KindValue):
    """{"verdict": "too_short" | "right" | "too_long"}."""

    verdict: str

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise InvalidInput(f"a length verdict is one of {', '.join(VERDICTS)}", field="verdict")


class Length(FeedbackKind):
    name = "length"
    Value = LengthValue
    target = "experience"
    folds = True
    labels = True
    pairs_by_fold = True
    api = True

    def signals(self, fb: Any) -> list[Signal]:
        value = self.parse(fb.value)
        assert isinstance(value, LengthValue)
        return [(fb.experience_id, 1.0 if value.verdict == "right" else 0.0, False)]

    def api_check(self, payload: Any) -> None:
        # The API's number: -1 too short, 0 right, 1 too long.
        if payload.value not in (-1, 0, 1):
            raise ValueError("a length verdict's value is -1 (too short), 0 (right) or 1 (too long)")

    def api_store(self, payload: Any, *, experience: int, who: Who) -> Feedback:
        verdict = VERDICTS[int(payload.value) + 1]
        feedback: Feedback = self.service(experience=experience, verdict=verdict, **who)
        return feedback


def feedback_length(*, run: Run, experience: Experience | int | None, verdict: str, author: Any = None,
                    api_key: Any = None, comment: str = "") -> Feedback:
    return feedback_store(run=run, kind="length", value=LengthValue(verdict=verdict), experience=experience,
                          author=author, api_key=api_key, comment=comment)


@pytest.fixture
def length_registered() -> Iterator[None]:
    kind_register(Length)
    kind_service("length")(feedback_length)
    yield
    registry.kind_unregister("length")


def _group(run: Run, n: int) -> list[Experience]:
    ids = experience_write(experiences=[
        experience_row(run, key=f"g1-{i}", group="g1", status="pending", auto_reward=None, reward=None,
                       response_text="x" * (10 * (i + 1)))
        for i in range(n)]).ids
    return list(Experience.objects.filter(pk__in=ids).order_by("id"))


def _api(run: Run) -> tuple[Client, dict[str, str]]:
    _, raw = api_key_create(name="env", runs=[run], actions=["read", "feedback"], rate_limit_per_minute=10_000)
    return Client(), {"Authorization": f"Bearer {raw}"}


def _post(run: Run, body: Mapping[str, Any]) -> Any:
    client, headers = _api(run)
    return client.post(f"/api/v1/runs/{run.pk}/feedback", data=json.dumps(body), content_type="application/json",
                       headers=headers)


def test_an_unregistered_kind_is_refused_by_name(owner: User) -> None:
    run = make_run(owner=owner)
    (exp,) = _group(run, 1)
    with pytest.raises(ValueError, match="unknown feedback kind 'length'; known: env_reward, rating"):
        kind_get("length")
    response = _post(run, {"kind": "length", "experience_id": exp.pk, "value": 1})
    assert response.status_code == 422
    assert "kind is one of env_reward, rating, pairwise, ranking, flag" in json.dumps(response.json())
    assert not Feedback.objects.filter(run=run).exists()


def test_a_registered_kind_is_stored_typed_and_folded_into_rewards(length_registered: None, owner: User,
                                                                   annotator: User) -> None:
    run = make_run(owner=owner, feedback={"mode": "human", "overlap": 1})
    add_member(run, annotator)
    short, right = _group(run, 2)
    fb = feedback_length(run=run, author=annotator, experience=short, verdict="too_short")
    # Stored in its one JSON shape, read back as its typed value.
    assert fb.value == {"verdict": "too_short"}
    assert Feedback.objects.get(pk=fb.pk).parsed == LengthValue(verdict="too_short")
    # Folded by the kernel's policy through the kind's signals: one of two members judged.
    assert [(e.human_reward, e.status) for e in Experience.objects.filter(pk__in=[short.pk, right.pk]).order_by("id")] \
        == [(0.0, "pending"), (None, "pending")]
    feedback_length(run=run, author=annotator, experience=right, verdict="right")
    after = list(Experience.objects.filter(pk__in=[short.pk, right.pk]).order_by("id"))
    assert [(e.human_reward, e.reward, e.status) for e in after] == [(0.0, 0.0, "ready"), (1.0, 1.0, "ready")]
    # Its value is checked where it is built, naming the field.
    with pytest.raises(InvalidInput, match="too_short, right, too_long") as bad:
        feedback_length(run=run, author=annotator, experience=right, verdict="huge")
    assert bad.value.field == "verdict"


def test_a_registered_kind_yields_preference_pairs_and_counts_as_a_label(length_registered: None, owner: User) -> None:
    run = make_run(owner=owner, feedback={"mode": "blend", "overlap": 1})
    short, right, long_ = _group(run, 3)
    for exp, verdict in ((short, "too_short"), (right, "right"), (long_, "too_long")):
        feedback_length(run=run, author=owner, experience=exp, verdict=verdict)
    pairs = preference_pairs(run=run)
    # From the group's folded length rewards, as ratings do: right over each wrong length.
    assert sorted((p.kind, p.chosen_id, p.rejected_id, p.margin) for p in pairs) == [
        ("length", right.pk, short.pk, 1.0), ("length", right.pk, long_.pk, 1.0)]
    assert run_label_count(run=run) == 3


def test_a_registered_kind_reaches_the_environment_api_and_its_description(length_registered: None,
                                                                           owner: User) -> None:
    run = make_run(owner=owner)
    (exp,) = _group(run, 1)
    response = _post(run, {"kind": "length", "experience_id": exp.pk, "value": 1})
    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["kind"], body["value"], body["experience_id"]) == ("length", {"verdict": "too_long"}, exp.pk)
    refused = _post(run, {"kind": "length", "experience_id": exp.pk, "value": 3})
    assert refused.status_code == 422 and "-1 (too short)" in json.dumps(refused.json())
    # Fields only another kind may set are refused, as for the built-in kinds.
    refused = _post(run, {"kind": "length", "experience_id": exp.pk, "value": 0, "order": [exp.pk]})
    assert refused.status_code == 422 and "order is for ranking feedback only" in json.dumps(refused.json())
    assert Feedback.objects.filter(run=run).count() == 1
    schema = Client().get("/api/v1/openapi.json").json()
    assert "length" in schema["components"]["schemas"]["FeedbackIn"]["properties"]["kind"]["enum"]
