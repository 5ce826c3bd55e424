"""A kind of feedback is one module: its typed value, target, fold, pairs, service, API body,
CLI options and panel, registered under its name — and no other file names it. Here one is
added from a single module under tests/ (tests/feedback/kind_length_fit.py, with its panel's
template beside it): the service stores it, the policy folds it into members' human rewards,
the reward model gets its preference pairs, the learned policy counts it as a label, and the
annotation page, the environment API and `rft feedback` take it, with no migration."""

from __future__ import annotations

import importlib
import json
import os
import sys
from collections.abc import Iterator, Mapping
from io import StringIO
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.test import Client
from django.urls import reverse

from apps.buffer.models import Experience
from apps.buffer.services import experience_write
from apps.envapi.services import api_key_create
from apps.feedback import kinds as registry
from apps.feedback.kinds import kind_get
from apps.feedback.reward_model.versions import run_label_count
from apps.feedback.models import Feedback
from apps.feedback.reward_model.preferences import preference_pairs
from apps.feedback.selectors import feedback_counts
from apps.runs.models import Run
from kernel.exceptions import InvalidInput
from tests.factories import add_member, experience_row, make_run

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
MODULE = "tests.feedback.kind_length_fit"
HX: dict[str, Any] = {"HTTP_HX_REQUEST": "true"}


@pytest.fixture
def length_fit(settings: Any) -> Iterator[ModuleType]:
    """The kind's module imported (which registers it, as a built-in kind's module does), its
    panel's template found beside it; taken out again afterwards."""
    engine = settings.TEMPLATES[0]
    settings.TEMPLATES = [{**engine, "DIRS": [*engine["DIRS"], HERE / "kind_templates"]}, *settings.TEMPLATES[1:]]
    module = importlib.import_module(MODULE)
    yield module
    registry.kind_unregister(module.NAME)
    sys.modules.pop(MODULE, None)


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


def _rft(*args: object) -> str:
    out = StringIO()
    call_command("rft", *[str(a) for a in args], stdout=out, stderr=StringIO())
    return out.getvalue()


def _rewards(members: list[Experience]) -> list[tuple[float | None, str]]:
    return [(e.human_reward, e.status) for e in Experience.objects.filter(pk__in=[m.pk for m in members]).order_by("id")]


def test_an_unregistered_kind_is_refused_by_name(owner: User) -> None:
    run = make_run(owner=owner)
    (exp,) = _group(run, 1)
    with pytest.raises(ValueError, match="unknown feedback kind 'length_fit'; known: env_reward, rating"):
        kind_get("length_fit")
    response = _post(run, {"kind": "length_fit", "experience_id": exp.pk, "verdict": "right"})
    assert response.status_code == 422
    assert "kind is one of env_reward, rating, pairwise, ranking, flag" in json.dumps(response.json())
    # The column takes only registered names (its validator), though it has no choices.
    with pytest.raises(ValidationError, match="unknown feedback kind 'length_fit'"):
        Feedback(run=run, kind="length_fit", experience=exp, group_id="g1", value={"verdict": "right"}).full_clean()
    assert not Feedback.objects.filter(run=run).exists()


def test_a_revisable_kind_without_its_revision_fields_is_refused_at_registration() -> None:
    from apps.feedback.kinds import FeedbackKind, kind_register

    class Unformed(FeedbackKind):
        name = "unformed"
        revisable = True

    with pytest.raises(ValueError, match="unformed feedback kind is revisable: .*revision_template"):
        kind_register(Unformed)
    with pytest.raises(ValueError, match="unknown feedback kind 'unformed'"):
        kind_get("unformed")


def test_a_registered_kind_is_stored_typed_and_folded_into_rewards(length_fit: ModuleType, owner: User,
                                                                   annotator: User) -> None:
    run = make_run(owner=owner, feedback={"mode": "human", "overlap": 1})
    add_member(run, annotator)
    short, right = _group(run, 2)
    fb = length_fit.feedback_length_fit(run=run, author=annotator, experience=short, verdict="too_short")
    # Stored in its one JSON shape, read back as its typed value; the column's validator takes it.
    assert fb.value == {"verdict": "too_short"}
    assert Feedback.objects.get(pk=fb.pk).parsed == length_fit.LengthFitValue(verdict="too_short")
    Feedback.objects.get(pk=fb.pk).full_clean()
    # Folded by the kernel's policy through the kind's votes: one of two members judged.
    assert _rewards([short, right]) == [(0.0, "pending"), (None, "pending")]
    length_fit.feedback_length_fit(run=run, author=annotator, experience=right, verdict="right")
    after = list(Experience.objects.filter(pk__in=[short.pk, right.pk]).order_by("id"))
    assert [(e.human_reward, e.reward, e.status) for e in after] == [(0.0, 0.0, "ready"), (1.0, 1.0, "ready")]
    # Its value is checked where it is built, naming the field.
    with pytest.raises(InvalidInput, match="too_short, right, too_long") as bad:
        length_fit.feedback_length_fit(run=run, author=annotator, experience=right, verdict="huge")
    assert bad.value.field == "verdict"


def test_a_registered_kind_yields_preference_pairs_and_counts_as_a_label(length_fit: ModuleType,
                                                                         owner: User) -> None:
    run = make_run(owner=owner, feedback={"mode": "blend", "overlap": 1})
    short, right, long_ = _group(run, 3)
    # The run's counts list every registered kind, none given yet too.
    assert feedback_counts(run=run)["length_fit"] == 0
    for exp, verdict in ((short, "too_short"), (right, "right"), (long_, "too_long")):
        length_fit.feedback_length_fit(run=run, author=owner, experience=exp, verdict=verdict)
    pairs = preference_pairs(run=run)
    # From the group's folded length rewards, as ratings do: right over each wrong length.
    assert sorted((p.kind, p.chosen_id, p.rejected_id, p.margin) for p in pairs) == [
        ("length_fit", right.pk, short.pk, 1.0), ("length_fit", right.pk, long_.pk, 1.0)]
    assert run_label_count(run=run) == 3
    assert feedback_counts(run=run)["length_fit"] == 3


def test_a_kind_from_one_module_is_given_through_the_page_the_api_and_the_cli_to_the_fold(
    length_fit: ModuleType, owner: User, annotator: User
) -> None:
    run = make_run(owner=owner, feedback={"mode": "human", "overlap": 1})
    add_member(run, annotator)
    short, right, long_ = _group(run, 3)

    # The page: each item's card links to the kind's panel; its form stores one.
    person = Client()
    person.force_login(annotator)
    page = person.get(reverse("feedback:page", kwargs={"run_id": run.pk})).content.decode()
    panel = reverse("feedback:panel", kwargs={"run_id": run.pk, "experience_id": short.pk, "slug": "length_fit"})
    assert f'class="act-length_fit" data-key="l" href="{panel}"' in page
    assert '"length_fit": "length judged"' in page  # what the page's script marks a card with
    shown = person.get(panel, **HX).content.decode()
    assert 'name="verdict" value="too_short"' in shown and f'hx-post="{panel}"' in shown
    refused = person.post(panel, {"verdict": "huge"}, **HX)
    assert refused.status_code == 400 and "too_short, right, too_long" in refused.content.decode()
    saved = person.post(panel, {"verdict": "too_short"}, **HX)
    assert saved.status_code == 200 and "Saved: your length fit" in saved.content.decode()
    assert _rewards([short, right, long_]) == [(0.0, "pending"), (None, "pending"), (None, "pending")]

    # The environment API: the feedback body's union takes the kind's own body, and describes it.
    response = _post(run, {"kind": "length_fit", "experience_id": right.pk, "verdict": "right"})
    assert response.status_code == 200, response.content
    assert (response.json()["kind"], response.json()["value"]) == ("length_fit", {"verdict": "right"})
    for body, said in (({"verdict": "huge"}, "verdict"), ({"verdict": "right", "score": 3}, "score is for rating"),
                       ({"verdict": "right", "order": [right.pk]}, "order is for ranking feedback only")):
        refused = _post(run, {"kind": "length_fit", "experience_id": right.pk, **body})
        assert refused.status_code == 422 and said in json.dumps(refused.json()), refused.content
    schema = Client().get("/api/v1/openapi.json").json()
    body_schema = schema["paths"]["/api/v1/runs/{run_id}/feedback"]["post"]["requestBody"]["content"][
        "application/json"]["schema"]
    described = {one["properties"]["kind"]["const"]: one for one in body_schema["oneOf"]}
    assert list(described) == ["env_reward", "rating", "pairwise", "ranking", "flag", "length_fit"]
    assert described["length_fit"]["properties"]["verdict"]["enum"] == ["too_short", "right", "too_long"]
    assert body_schema["discriminator"] == {"propertyName": "kind"}

    # The CLI: `rft feedback RUN length_fit` takes the kind's own options.
    out = _rft("feedback", run.pk, "length_fit", "--as", annotator.username, "--experience", long_.pk,
               "--verdict", "too_long")
    assert "length_fit {'verdict': 'too_long'}" in out

    # All three doors stored the same shape, and the fold made the group trainable.
    assert sorted(Feedback.objects.filter(run=run).values_list("value__verdict", flat=True)) == [
        "right", "too_long", "too_short"]
    assert _rewards([short, right, long_]) == [(0.0, "ready"), (1.0, "ready"), (0.0, "ready")]

    # The person's revision, before the group trains: the form shows the kind's own fields with
    # its value, and the kind stores what they post; the fold takes the new verdict.
    mine = Feedback.objects.get(run=run, author=annotator, experience=short)
    revise = f"/runs/{run.pk}/annotate/mine/{mine.pk}/revise/"
    shown = person.get(revise, **HX).content.decode()
    assert 'name="verdict" value="too_short" checked' in shown and 'value="right">' in shown
    revised = person.post(revise, {"verdict": "right"}, **HX)
    assert revised.status_code == 200, revised.content.decode()[:500]
    assert Feedback.objects.get(run=run, author=annotator, experience=short).value == {"verdict": "right"}
    assert _rewards([short, right, long_]) == [(1.0, "ready"), (1.0, "ready"), (0.0, "ready")]


def test_a_new_kind_touches_its_own_files_only_and_needs_no_migration(length_fit: ModuleType) -> None:
    # What names the kind: its module, its panel's template and this test; nothing in the
    # application, its templates, its scripts or its migrations.
    naming = set()
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in ("var", "node_modules", "__pycache__", "site")]
        for name in files:
            path = Path(folder, name)
            if path.suffix in (".py", ".html", ".js", ".md", ".toml", ".yml", ".yaml", ".css", ".txt"):
                if length_fit.NAME in path.read_text(errors="replace"):
                    naming.add(path.relative_to(ROOT).as_posix())
    assert naming == {"tests/feedback/kind_length_fit.py", "tests/feedback/kind_templates/feedback/_length_fit.html",
                      "tests/feedback/test_kind_registry.py"}
    # Feedback.kind has no choices: registered, the kind changes no model state.
    call_command("makemigrations", "feedback", "--check", "--dry-run", stdout=StringIO())
