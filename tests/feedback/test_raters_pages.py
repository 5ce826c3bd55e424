"""The owner's doors to the raters figures: the Raters page (figures, gold items), the same
figures in the API, the reward-model panel of the run page, and the preference export."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.test import Client

from apps.buffer.models import Experience
from apps.buffer.services import experience_write
from apps.envapi.services import api_key_create
from apps.feedback.kinds.pairwise import feedback_compare
from apps.feedback.kinds.rating import feedback_rate
from apps.rewards.models import GoldItem, RewardModel
from apps.runs.models import Run
from tests.factories import add_member, experience_row, make_run

pytestmark = pytest.mark.django_db
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def rated_run(owner: User, annotator: User) -> Run:
    run = make_run(owner=owner, feedback={"mode": "blend", "overlap": 2, "rater_weighting": "agreement"},
                   reward_model={"enabled": True})
    add_member(run, annotator)
    rows = [experience_row(run, key=f"k{i}", group=f"g{i // 2}", status="pending", reward=None, auto_reward=0.5,
                           response_text=f"<b>answer</b> {i}") for i in range(6)]
    exps = list(Experience.objects.filter(pk__in=experience_write(experiences=rows).ids).order_by("id"))
    for e, (s1, s2) in zip(exps, [(5, 4), (1, 2), (5, 5), (2, 1), (4, 4), (1, 1)], strict=True):
        feedback_rate(run=run, author=owner, experience=e, score=s1)
        feedback_rate(run=run, author=annotator, experience=e, score=s2)
    feedback_compare(run=run, author=annotator, experience=exps[0], other=exps[1], winner="a")
    return run


def _client(user: User) -> Client:
    c = Client()
    c.force_login(user)
    return c


def test_the_owner_sees_agreement_and_each_rater_on_the_raters_page(rated_run: Run, owner: User) -> None:
    page = _client(owner).get(f"/runs/{rated_run.pk}/signal/raters/")
    assert page.status_code == 200
    html = page.content.decode()
    assert 'data-rater="annotator"' in html and 'data-rater="owner"' in html
    assert "Krippendorff" in html and 'data-figure="rating_alpha_ordinal"' in html
    labels = re.search(r'data-rater="annotator">.*?data-figure="labels">(\d+)<', html, re.DOTALL)
    assert labels and labels.group(1) == "7"


def test_the_raters_link_shows_only_where_the_page_opens(rated_run: Run, owner: User, annotator: User) -> None:
    # The newcomer crawl (tests/test_newcomer_crawl.py) found the reward-model panel linking
    # annotators and viewers to the owner's raters page: a link to a 403.
    link = f'href="/runs/{rated_run.pk}/signal/raters/"'
    for path in (f"/runs/{rated_run.pk}/", f"/runs/{rated_run.pk}/signal/reward-model/"):
        assert link in _client(owner).get(path).content.decode()
        assert link not in _client(annotator).get(path).content.decode()


def test_only_the_owner_sees_raters(rated_run: Run, annotator: User, outsider: User) -> None:
    assert _client(annotator).get(f"/runs/{rated_run.pk}/signal/raters/").status_code == 403
    assert _client(outsider).get(f"/runs/{rated_run.pk}/signal/raters/").status_code == 404
    assert _client(annotator).get(f"/runs/{rated_run.pk}/signal/raters.json").status_code == 403
    assert _client(annotator).get(f"/runs/{rated_run.pk}/signal/preferences.jsonl").status_code == 403


def test_the_owner_marks_gold_items_and_bad_input_names_the_field(rated_run: Run, owner: User) -> None:
    c = _client(owner)
    exp = Experience.objects.filter(run=rated_run).first()
    assert exp is not None
    bad = c.post(f"/runs/{rated_run.pk}/signal/raters/", {"experience": exp.pk, "score": "9"})
    assert bad.status_code == 400 and "score:" in bad.content.decode()
    missing = c.post(f"/runs/{rated_run.pk}/signal/raters/", {"experience": "999999", "score": "4"})
    assert missing.status_code == 400 and "experience:" in missing.content.decode()
    assert not GoldItem.objects.exists()
    ok = c.post(f"/runs/{rated_run.pk}/signal/raters/", {"experience": exp.pk, "score": "5"})
    assert ok.status_code == 302 and GoldItem.objects.get(run=rated_run).answer == 1.0
    page = c.get(f"/runs/{rated_run.pk}/signal/raters/").content.decode()
    assert f"#{exp.pk}" in page and "&lt;b&gt;answer&lt;/b&gt;" in page  # model output escaped
    c.post(f"/runs/{rated_run.pk}/signal/raters/", {"unmark": exp.pk})
    assert not GoldItem.objects.exists()


def test_the_api_gives_the_same_figures_as_the_page(rated_run: Run, owner: User) -> None:
    _, raw = api_key_create(name="env", runs=[rated_run], actions=["read"], rate_limit_per_minute=1000)
    api = Client().get(f"/api/v1/runs/{rated_run.pk}/raters", headers={"Authorization": f"Bearer {raw}"})
    assert api.status_code == 200
    page = _client(owner).get(f"/runs/{rated_run.pk}/signal/raters.json").json()
    assert api.json() == json.loads(json.dumps(page))
    assert {r["rater"] for r in api.json()["raters"]} == {"owner", "annotator"}
    other = make_run(owner=owner)
    denied = Client().get(f"/api/v1/runs/{other.pk}/raters", headers={"Authorization": f"Bearer {raw}"})
    assert denied.status_code == 404  # as for a missing run: run ids cannot be probed (issue #33)
    assert Client().get(f"/api/v1/runs/{rated_run.pk}/raters").status_code == 401


def test_the_run_page_shows_the_reward_model_its_accuracy_and_the_rule(rated_run: Run, owner: User) -> None:
    RewardModel.objects.create(run=rated_run, version=1, path="/x", base="b", accuracy=0.875, pairs_train=10,
                               pairs_heldout=4, labels=13)
    html = _client(owner).get(f"/runs/{rated_run.pk}/").content.decode()
    assert 'data-figure="rm-version">v1<' in html and 'data-figure="rm-accuracy">0.875<' in html
    assert 'data-figure="rm-kind">head<' in html  # the config's kind (the default)
    assert "random share" in html
    assert "sibling pairs" in html  # feedback.selection.pairs, on by default
    panel = _client(owner).get(f"/runs/{rated_run.pk}/signal/reward-model/", HTTP_HX_REQUEST="true")
    assert panel.status_code == 200 and 'id="reward-model"' in panel.content.decode()


def test_the_run_page_says_how_sure_the_gate_is_of_the_newest_reward_model(owner: User) -> None:
    run = make_run(owner=owner, feedback={"mode": "learned", "min_rm_accuracy": 0.75, "rm_gate": "bound"},
                   reward_model={"enabled": True})
    RewardModel.objects.create(run=run, version=1, path="/x", base="b", accuracy=1.0, pairs_heldout=5)
    html = _client(owner).get(f"/runs/{run.pk}/signal/reward-model/", HTTP_HX_REQUEST="true").content.decode()
    # 5 of 5 right: at least 0.649 with 95% confidence, short of 0.75: still waiting.
    assert "at least 0.75 with 95% confidence" in html and 'data-figure="rm-bound">0.649<' in html


@pytest.mark.parametrize("gate,waiting,in_use", [
    ("bound", "at least 0.75 with 95% confidence", "Using v2."),
    ("evidence", "above 0.5 (better than chance) with 95% confidence", "its calibrated scores at weight"),
    ("calibrated", "above 0.5 (better than chance) with 95% confidence", "Using v2."),
])
def test_the_reward_model_panel_says_when_the_runs_gate_opens_and_what_weight_it_gives(
    owner: User, gate: str, waiting: str, in_use: str,
) -> None:
    from apps.feedback.reward_model.versions import accuracy_lower_bound

    run = make_run(owner=owner, feedback={"mode": "learned", "min_rm_accuracy": 0.75, "rm_gate": gate},
                   reward_model={"enabled": True})
    RewardModel.objects.create(run=run, version=1, path="/x", base="b", accuracy=0.55, pairs_heldout=20)
    url = f"/runs/{run.pk}/signal/reward-model/"
    html = _client(owner).get(url, HTTP_HX_REQUEST="true").content.decode()
    assert "Waiting as blend" in html and waiting in html, html
    # 18 of 20: bound 0.699 > 0.5 opens evidence and calibrated; bound 0.75 waits for 0.75.
    RewardModel.objects.create(run=run, version=2, path="/y", base="b", accuracy=0.9, pairs_heldout=20)
    html = _client(owner).get(url, HTTP_HX_REQUEST="true").content.decode()
    if gate == "bound":
        assert "Waiting as blend" in html
        return
    weight = (accuracy_lower_bound(accuracy=0.9, pairs=20, confidence=0.95) - 0.5) / 0.25
    assert in_use in html and (gate == "calibrated") == ("rm-weight" not in html), html
    assert gate == "calibrated" or f'data-figure="rm-weight">{weight:.2f}<' in html


def test_preference_pairs_download_in_trl_format(rated_run: Run, owner: User) -> None:
    response = _client(owner).get(f"/runs/{rated_run.pk}/signal/preferences.jsonl")
    rows = [json.loads(line) for line in response.content.decode().splitlines()]
    assert rows and all({"prompt", "chosen", "rejected"} <= set(r) for r in rows)
    assert {r["kind"] for r in rows} == {"rating", "pairwise"}


def test_signal_templates_have_no_inline_scripts_or_styles() -> None:
    for path in (ROOT / "templates" / "rewards").glob("*.html"):
        text = path.read_text()
        assert "style=" not in text and "<style" not in text, path
        assert not re.search(r"<script(?![^>]*\bsrc=)", text), path


def test_a_malformed_unmark_is_a_form_error_not_a_traceback(rated_run: Run, owner: User) -> None:
    bad = _client(owner).post(f"/runs/{rated_run.pk}/signal/raters/", {"unmark": "x1"})
    assert bad.status_code == 400 and "unmark:" in bad.content.decode()
