"""A run's summary when it ends (issue 32, item 1), and finished runs inviting no annotation
anywhere. Django's test client and the API here; the weights download through a real train
worker in test_weights_download.py; the pages in a real browser in test_pages_round2.py."""

from __future__ import annotations

import json
import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.test import Client

from apps.envapi.services import api_key_create
from apps.feedback.models import Feedback
from apps.feedback.kinds.submit import FeedbackClosed
from apps.feedback.handout.lease import assignment_claim
from apps.feedback.kinds.flag import feedback_flag
from apps.feedback.kinds.pairwise import feedback_compare
from apps.feedback.kinds.rating import feedback_rate
from apps.runs.metrics import metric_record
from apps.runs.models import AuditEntry, ModelVersion, Run
from apps.runs.services import run_transition
from tests.factories import add_member, make_experiences, make_run, make_taskset, make_user

pytestmark = pytest.mark.django_db


def logged_in(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def summary_of(html: str) -> str:
    match = re.search(r'<section id="summary".*?</section>', html, re.S)
    assert match, "no summary on the page"
    return match.group(0)


@pytest.fixture
def finished(owner: User, annotator: User) -> Run:
    """A run that ran 3 steps: rewards rose, one evaluation, people rated and compared."""
    run = make_run(owner=owner, taskset=make_taskset(owner=owner), name="done", total_steps=3,
                   feedback={"mode": "blend"})
    add_member(run, annotator)
    run_transition(run=run, action="start", actor=owner)
    exps = make_experiences(run, groups=1, group_size=2)
    feedback_rate(run=run, experience=exps[0], score=5, author=annotator)
    feedback_rate(run=run, experience=exps[1], score=2, author=annotator)
    feedback_compare(run=run, experience=exps[0], other=exps[1].pk, winner="a", author=owner)
    feedback_flag(run=run, experience=exps[1], flags=["broken"], author=annotator)
    for step, reward in ((1, 0.2), (2, 0.6), (3, 0.5)):
        metric_record(run=run, step=step, values={"explore/reward_mean": reward, "feedback/human_reward_mean": reward / 2})
        ModelVersion.objects.create(run=run, number=step, checkpoint=f"/storage/runs/{run.pk}/v{step}", train_step=step)
    metric_record(run=run, step=2, values={"eval/reward_mean": 0.7, "eval/accuracy": 0.75, "eval/version": 2.0})
    metric_record(run=run, step=3, values={"eval/reward_mean": 0.4, "eval/accuracy": 0.5, "eval/version": 3.0})
    Run.objects.filter(pk=run.pk).update(explore_step=3, train_step=3, current_version=3)
    AuditEntry.objects.filter(run=run, action="start").update(created_at=AuditEntry.objects.get(
        run=run, action="start").created_at - timedelta(minutes=12, seconds=5))
    run.refresh_from_db()
    return run_transition(run=run, action="finish")


def test_a_finished_run_shows_its_summary(finished: Run, owner: User) -> None:
    html = summary_of(logged_in(owner).get(f"/runs/{finished.pk}/").content.decode())
    assert 'data-status="finished"' in html
    assert re.search(r'data-figure="duration">12 min [56] s', html), html
    assert "train 3 · explore 3 of 3" in html and "3 published" in html
    row = re.search(r'<tr data-metric="explore/reward_mean">(.*?)</tr>', html, re.S)
    assert row
    cells = re.findall(r'<td class="num"[^>]*>(.*?)</td>', row.group(1))
    assert cells == ["0.200", "0.500", "+0.300", "0.600", "2"]  # start, end, change, best, at step
    assert 'data-metric="eval/accuracy"' in html and 'data-metric="feedback/human_reward_mean"' in html
    # Labels used, and by whom (kinds as people call them): the labels figure is the ledger's
    # total (issue 64 item 1: it counted a flag, and said 48 where the ledger said 47); the flag
    # is named apart.
    assert re.search(r'data-figure="labels">3: 2 ratings, 1 A/B choice <span class="muted" '
                     r'data-figure="other-feedback">\(and 1 flag: not labels\)', html), html
    assert 'id="ledger-summary" data-total="3"' in html
    assert re.search(r"<strong>annotator</strong>: 2 \(2 ratings\) <span class=\"muted\">and 1 flag</span>", html)
    assert re.search(r"<strong>owner</strong>: 1 \(1 A/B choice\)", html)
    # The best version is the held-out evaluation's best by its accuracy (the default where
    # the domain has a verifier), the metric named, offered for download once packed.
    assert 'data-version="2"' in html and 'data-chosen-by="eval/accuracy"' in html
    assert "highest held-out accuracy (the domain&#x27;s verifier) (0.750); chosen by eval/accuracy" in html
    assert "Prepare v2 weights for download" in html
    for kind in ("sft", "dpo", "grpo", "preferences"):
        assert f"/runs/{finished.pk}/export/{kind}.jsonl" in html


def test_without_an_evaluation_the_last_version_is_offered(owner: User) -> None:
    run = make_run(owner=owner, name="plain")
    Run.objects.filter(pk=run.pk).update(status=Run.Status.STOPPED, current_version=2)
    ModelVersion.objects.create(run=run, number=2, checkpoint="/x/v2", train_step=4)
    html = summary_of(logged_in(owner).get(f"/runs/{run.pk}/").content.decode())
    assert 'data-version="2"' in html and "the last version published (no held-out evaluation chose one)" in html
    assert "never started" in html  # no start in its audit log


def test_a_running_run_has_no_summary_and_its_summary_url_says_so(owner: User) -> None:
    run = make_run(owner=owner, taskset=make_taskset(owner=owner))
    run_transition(run=run, action="start", actor=owner)
    client = logged_in(owner)
    assert 'class="card run-summary"' not in client.get(f"/runs/{run.pk}/").content.decode()
    assert client.get(f"/runs/{run.pk}/summary/")["Location"] == f"/runs/{run.pk}/"


def test_the_failure_reason_heads_a_failed_runs_summary(owner: User) -> None:
    run = make_run(owner=owner, taskset=make_taskset(owner=owner))
    run_transition(run=run, action="start", actor=owner)
    run_transition(run=run, action="fail", reason="explore step 1 failed 3 times in a row; OSError: disk full")
    html = summary_of(logged_in(owner).get(f"/runs/{run.pk}/").content.decode())
    assert "Failed: explore step 1 failed 3 times in a row; OSError: disk full" in html
    assert "No trained version" in html


# --- finished runs invite no annotation, anywhere ---------------------------------------------

def test_a_finished_run_invites_no_annotation_on_any_page_or_in_the_api(finished: Run, owner: User,
                                                                         annotator: User) -> None:
    open_ = make_experiences(finished, groups=1, group_size=2, status="pending")
    client = logged_in(annotator)
    # The annotator's home page: no Annotate, no "waiting".
    row = re.search(rf'<tr data-run="{finished.pk}".*?</tr>', client.get("/runs/").content.decode(), re.S)
    assert row and "Annotate" not in row.group(0) and "waiting" not in row.group(0)
    # The run page: its summary, no Annotate button, no invitation to rate.
    page = client.get(f"/runs/{finished.pk}/").content.decode()
    assert 'class="button annotate-link"' not in page and "human-loop-hint" not in page
    # The annotation page: says why and lists nothing; its queue hands nothing out.
    page = client.get(f"/runs/{finished.pk}/annotate/").content.decode()
    assert "This run is finished: it takes no more feedback" in page and 'data-assignment="' not in page
    assert assignment_claim(run=finished, annotator=annotator, size=4) == []
    assert client.get(f"/runs/{finished.pk}/annotate/queue/?after=0").content.decode().strip() == ""
    # Feedback through any door is refused, naming why; nothing is stored.
    before = Feedback.objects.count()
    with pytest.raises(FeedbackClosed, match="is finished: it takes no more feedback"):
        feedback_rate(run=finished, experience=open_[0], score=4, author=annotator)
    _, raw = api_key_create(name="env", runs=[finished], actions=["feedback"], rate_limit_per_minute=100)
    _, raw_read = api_key_create(name="reader", runs=[finished], actions=["read"], rate_limit_per_minute=100)
    response = Client().post(f"/api/v1/runs/{finished.pk}/feedback", json.dumps(
        {"kind": "rating", "experience_id": open_[0].pk, "score": 4}), content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert response.status_code == 409 and "takes no more feedback" in response.json()["detail"]
    run_out = Client().get(f"/api/v1/runs/{finished.pk}", HTTP_AUTHORIZATION=f"Bearer {raw_read}").json()
    assert run_out["status"] == "finished" and run_out["takes_feedback"] is False
    edit = client.post(f"/runs/{finished.pk}/annotate/experiences/{open_[0].pk}/edit/", {"text": "better"})
    assert edit.status_code == 400 and b"takes no more feedback" in edit.content
    assert Feedback.objects.count() == before


def test_a_failed_run_and_an_auto_run_offer_no_annotate_link(owner: User, annotator: User) -> None:
    failed = make_run(owner=owner, taskset=make_taskset(owner=owner), name="failed", feedback={"mode": "blend"})
    auto = make_run(owner=owner, taskset=make_taskset(owner=owner), name="auto", feedback={"mode": "auto"})
    people = make_run(owner=owner, taskset=make_taskset(owner=owner), name="people", feedback={"mode": "blend"})
    corrections = make_run(owner=owner, taskset=make_taskset(owner=owner), name="sft", algorithm="sft", repeat_times=1)
    for run in (failed, auto, people, corrections):
        add_member(run, annotator)
    run_transition(run=failed, action="start", actor=owner)
    run_transition(run=failed, action="fail", reason="boom")
    home = logged_in(annotator).get("/runs/").content.decode()

    def offered(run: Run) -> bool:
        row = re.search(rf'<tr data-run="{run.pk}".*?</tr>', home, re.S)
        assert row
        return "annotate-link" in row.group(0)

    assert (offered(failed), offered(auto), offered(people), offered(corrections)) == (False, False, True, True)
    page = logged_in(annotator).get(f"/runs/{auto.pk}/").content.decode()
    assert 'class="button annotate-link"' not in page


# --- wording ------------------------------------------------------------------------------

def test_the_pages_say_things_as_people_do(finished: Run, owner: User, annotator: User) -> None:
    client = logged_in(owner)
    audit = client.get(f"/runs/{finished.pk}/audit/").content.decode()
    assert '<strong data-action="finish">finished</strong>' in audit and "by system" not in audit
    assert '<strong data-action="start">started by owner</strong>' in audit
    assert "finished" in client.get("/runs/").content.decode()
    mine = logged_in(annotator).get(f"/runs/{finished.pk}/annotate/mine/").content.decode()
    assert re.search(r'<span class="kind">flag</span>\s*#\d+:\s*broken', mine), mine
    assert "flagged: broken" not in mine


def test_a_rater_is_one_rater_and_a_5_star_gold_item_says_5_stars(owner: User, annotator: User) -> None:
    from apps.rewards.gold import gold_item_mark

    run = make_run(owner=owner, taskset=make_taskset(owner=owner), feedback={"mode": "blend"})
    add_member(run, annotator)
    exps = make_experiences(run, groups=1, group_size=2, status="pending")
    feedback_rate(run=run, experience=exps[0], score=4, author=annotator)
    gold_item_mark(run=run, experience_id=exps[1].pk, score=5, actor=owner)
    html = logged_in(owner).get(f"/runs/{run.pk}/signal/raters/").content.decode()
    assert "1 rater over 1 rated item." in html
    assert '<td data-figure="gold-answer">5★</td>' in html


def test_a_preference_saved_says_which_answer_won(owner: User, annotator: User) -> None:
    run = make_run(owner=owner, taskset=make_taskset(owner=owner), feedback={"mode": "blend"})
    add_member(run, annotator)
    exps = make_experiences(run, groups=1, group_size=2, status="pending")
    response = logged_in(annotator).post(f"/runs/{run.pk}/annotate/experiences/{exps[0].pk}/compare/",
                                         {"other": exps[1].pk, "winner": "a"}, HTTP_HX_REQUEST="true")
    assert "Preference saved: A is better" in response.content.decode()


def test_saving_the_feedback_settings_asks_once(owner: User) -> None:
    run = make_run(owner=owner)
    html = logged_in(owner).get(f"/runs/{run.pk}/").content.decode()
    form = re.search(r'<form id="feedback-settings".*?</form>', html, re.S)
    assert form and "hx-confirm" not in form.group(0) and 'name="confirm"' in form.group(0)
