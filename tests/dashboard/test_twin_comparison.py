"""A run and its twin (issues #46 item 4, #62 item 4, #64 item 6): the twin is the run copied
with people's feedback off, by construction; labels on it are refused at every door; the run
page and the summary of either show each run's gain in every preference share over the steps
both evaluated, from version 0, and the difference with its 95% interval, computed from the
metric rows; the twin's page invites nobody to label it."""

from __future__ import annotations

import json
import math
import re
from io import StringIO
from pathlib import Path
from statistics import NormalDist
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client

from apps.cli.management.commands.rft_demo import DEMO_RUN
from apps.control.twins import run_twin_create, run_twin_pair, share_gains, twin_config
from apps.envapi.services import api_key_create
from apps.feedback.kinds.rating import feedback_rate
from apps.feedback.models import Feedback
from apps.feedback.kinds.submit import FeedbackClosed
from apps.feedback.handout.lease import assignment_claim
from apps.runs.metrics import metric_record
from apps.buffer.models import Task
from apps.runs.models import Run
from apps.runs.selectors import config_differences
from apps.runs.services import run_transition
from tests.factories import add_member, make_experiences, make_run, make_taskset

pytestmark = pytest.mark.django_db

WORKING = "eval/preference/working"
CONCISE = "eval/preference/concise"
TASKS = 64
# What the people run taught: a learned policy and the reward model it needs.
TAUGHT = {"feedback": {"mode": "learned", "guidelines": "Show the working."}, "reward_model": {"enabled": True}}


def logged_in(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def interval(shares: tuple[float, float, float, float], n: int) -> tuple[float, float]:
    """The difference's 95% interval, recomputed here: a normal interval over four independent
    shares of n tasks each, each share's variance with one success and one failure added."""
    ps, pe, ts, te = shares
    half = NormalDist().inv_cdf(0.975) * math.sqrt(sum((x * n + 1) / (n + 2) * (1 - (x * n + 1) / (n + 2)) / (n + 2)
                                                       for x in shares))
    return (pe - ps) - (te - ts) - half, (pe - ps) - (te - ts) + half


def test_the_gains_run_from_version_0_to_the_last_step_both_runs_evaluated() -> None:
    # Rows in no particular order; steps only one run evaluated, a share only one run measured
    # and other metrics are left out.
    people = [(WORKING, 6, 0.8), (WORKING, 0, 0.3), (WORKING, 4, 0.9), (CONCISE, 0, 0.5), (CONCISE, 6, 0.25),
              ("eval/preference/in_words", 0, 0.1), ("eval/accuracy", 2, 0.9), (WORKING, 10, 0.99)]
    twin = [(WORKING, 0, 0.35), (WORKING, 6, 0.45), (WORKING, 8, 0.9), (CONCISE, 6, 0.2), (CONCISE, 0, 0.5),
            ("eval/accuracy", 6, 0.5)]
    tasks = {0: float(TASKS), 6: float(TASKS)}
    gains = {g.name: g for g in share_gains(people=people, twin=twin, people_tasks=tasks, twin_tasks=tasks)}
    assert sorted(gains) == [CONCISE, WORKING]
    working = gains[WORKING]
    assert (working.people_start, working.people_end, working.twin_start, working.twin_end) == (0.3, 0.8, 0.35, 0.45)
    assert working.people_gain == pytest.approx(0.5)
    assert working.twin_gain == pytest.approx(0.1)
    assert working.difference == pytest.approx(0.4)
    assert (working.low, working.high) == pytest.approx(interval((0.3, 0.8, 0.35, 0.45), TASKS))
    assert working.low is not None and 0 < working.low < 0.4 < (working.high or 0) < 0.8
    assert gains[CONCISE].difference == pytest.approx(-0.25 - -0.3)
    assert working.label == "preference share: working"
    # Without the task counts, no interval is made up.
    assert share_gains(people=people, twin=twin)[0].low is None


def test_no_comparison_without_version_0s_evaluation_in_both_runs() -> None:
    people = [(WORKING, 2, 0.3), (WORKING, 6, 0.8)]
    twin = [(WORKING, 0, 0.3), (WORKING, 2, 0.35), (WORKING, 6, 0.45)]
    assert share_gains(people=people, twin=twin) == []
    assert share_gains(people=[(WORKING, 0, 0.3)], twin=[(WORKING, 0, 0.3)]) == []  # version 0 alone: no gain


def test_a_twin_is_its_run_with_peoples_feedback_off_and_nothing_else_changed(owner: User) -> None:
    people = make_run(owner=owner, taskset=make_taskset(owner=owner), name="taught", seed=7, total_steps=12, **TAUGHT)
    twin = run_twin_create(run=people, actor=owner)
    assert twin.twin_of_id == people.pk and twin.status == Run.Status.DRAFT and twin.taskset_id == people.taskset_id
    assert [(d["path"], d["left"], d["right"]) for d in config_differences(people.config, twin.config)] == [
        ("feedback.mode", '"learned"', '"auto"'), ("reward_model.enabled", "true", "false")]
    assert (twin.cfg.seed, twin.cfg.total_steps, twin.cfg.algorithm) == (7, 12, people.cfg.algorithm)
    assert twin_config(twin.config).model_dump() == twin.cfg.model_dump()  # a twin's twin is the same


@pytest.fixture
def pair(owner: User) -> tuple[Run, Run]:
    people = make_run(owner=owner, taskset=make_taskset(owner=owner), name="taught", **TAUGHT)
    twin = run_twin_create(run=people, actor=owner)
    # Step 4 only the people run evaluated, step 8 only the twin: neither is compared.
    for run, values in ((people, ((0, 0.30), (2, 0.50), (4, 0.70), (6, 0.75))),
                        (twin, ((0, 0.30), (2, 0.33), (6, 0.42), (8, 0.9)))):
        for step, share in values:
            metric_record(run=run, step=step, values={WORKING: share, "eval/tasks": float(TASKS)})
    return people, twin


def twin_of(html: str) -> str:
    match = re.search(r'<div class="twin-comparison" id="twin".*?</div>\s*</div>', html, re.S)
    assert match, "no twin comparison on the page"
    return match.group(0)


def figures(html: str) -> dict[str, str]:
    return dict(re.findall(r'data-figure="([a-z-]+)">(?:<strong>)?([^<]*)', twin_of(html)))


def test_both_run_pages_show_the_gains_over_the_same_steps_with_an_interval(pair: tuple[Run, Run], owner: User) -> None:
    people, twin = pair
    low, high = interval((0.30, 0.75, 0.30, 0.42), TASKS)
    client = logged_in(owner)
    for run in (people, twin):
        html = twin_of(client.get(f"/runs/{run.pk}/").content.decode())
        assert figures(html) == {"people-gain": "+0.450", "twin-gain": "+0.120", "difference": "+0.330",
                                 "interval": f"{low:.3f} to {high:.3f}"}, html
        assert "0.300 → 0.750" in html and "0.300 → 0.420" in html
        assert 'data-steps="0,2,6"' in html and "0, 2, 6 (step 0 is version 0)" in html
        # Both are drafts: the figures are marked provisional, naming who goes on.
        assert 'id="twin-provisional"' in html and f"{twin.name} is draft" in html
        # What the twin changed, named.
        assert "<code>feedback.mode</code> &quot;learned&quot; → &quot;auto&quot;" in html
        assert "<code>reward_model.enabled</code> true → false" in html
    assert f'href="/runs/{twin.pk}/"' in twin_of(client.get(f"/runs/{people.pk}/").content.decode())
    assert "This run is the twin of" in twin_of(client.get(f"/runs/{twin.pk}/").content.decode())
    assert 'id="twin"' not in client.get(f"/runs/{make_run(owner=owner, name='alone').pk}/").content.decode()


def test_the_comparison_waits_for_version_0_in_both_runs(owner: User) -> None:
    people = make_run(owner=owner, taskset=make_taskset(owner=owner), name="taught", **TAUGHT)
    twin = run_twin_create(run=people, actor=owner)
    metric_record(run=people, step=2, values={WORKING: 0.5})
    metric_record(run=twin, step=2, values={WORKING: 0.3})
    metric_record(run=twin, step=0, values={WORKING: 0.3})
    html = logged_in(owner).get(f"/runs/{people.pk}/").content.decode()
    assert 'data-figure="difference"' not in html
    assert "Shown once both runs have evaluated version 0 and a later step in common" in html


def test_the_summary_shows_the_final_comparison_once_both_runs_ended(pair: tuple[Run, Run], owner: User) -> None:
    people, twin = pair
    for run in (people, twin):
        run_transition(run=run, action="start", actor=owner)
        run_transition(run=Run.objects.get(pk=run.pk), action="finish")
    client = logged_in(owner)
    page = client.get(f"/runs/{people.pk}/").content.decode()
    assert page.count('id="twin"') == 1  # inside the summary, not beside it too
    summary = client.get(f"/runs/{people.pk}/summary/").content.decode()
    assert figures(summary)["difference"] == "+0.330" and "provisional" not in twin_of(summary)


def test_a_twin_the_viewer_may_not_see_is_not_named(pair: tuple[Run, Run], annotator: User) -> None:
    people, twin = pair
    add_member(people, annotator)  # of the people run only
    html = logged_in(annotator).get(f"/runs/{people.pk}/").content.decode()
    assert 'id="twin"' not in html and twin.name not in html


def test_the_owner_makes_a_twin_from_the_run_page_and_lands_on_a_page_that_invites_no_labels(
    owner: User, annotator: User
) -> None:
    people = make_run(owner=owner, taskset=make_taskset(owner=owner), name="taught", **TAUGHT)
    add_member(people, annotator)
    client = logged_in(owner)
    page = client.get(f"/runs/{people.pk}/").content.decode()
    assert f'href="/runs/{people.pk}/twin/"' in page  # the door, on the owner's run page
    assert 'action="/runs/%d/twin/"' % people.pk in client.get(f"/runs/{people.pk}/twin/").content.decode()
    response = client.post(f"/runs/{people.pk}/twin/", follow=True)
    twin = Run.objects.exclude(pk=people.pk).get()
    assert response.redirect_chain == [(f"/runs/{twin.pk}/", 302)]
    twin_page = response.content.decode()
    assert "taught (without people) is taught with people&#x27;s feedback off: it takes no labels; it starts when " \
           "you start taught." in twin_page and "beside it" not in twin_page.split('id="twin"')[0]
    assert run_twin_pair(run=people) == (people, twin)
    assert not twin.members.exists()  # nobody but the owner
    make_experiences(twin, groups=4, group_size=4, status="pending")
    twin_page = client.get(f"/runs/{twin.pk}/").content.decode()
    # Nothing on it invites a label: no Annotate button, no count of what waits, no ledger of
    # labels, no feedback settings form, no "learned" reward, no groups waiting for people, no twin door.
    assert 'class="button annotate-link"' not in twin_page and "waiting" not in twin_page.split("<nav")[0]
    assert 'id="run-ledger"' not in twin_page and 'id="feedback-settings"' not in twin_page
    assert 'id="twin-no-feedback"' in twin_page and "human-loop-hint" not in twin_page
    assert "Learned reward =" not in twin_page and "wait for people" not in twin_page
    assert 'id="twin-no-reward-model"' in twin_page and "reward_model.enabled</code> in the run config" not in twin_page
    assert f'href="/runs/{twin.pk}/review/"' not in twin_page
    assert f'href="/runs/{twin.pk}/twin/"' not in twin_page
    assert client.get(f"/runs/{twin.pk}/waiting/").content.decode().count("Waiting:") == 0
    # Not a door for an annotator of the run, nor for a run that takes no people's feedback.
    other = logged_in(annotator)
    assert f'/runs/{people.pk}/twin/' not in other.get(f"/runs/{people.pk}/").content.decode()
    assert other.post(f"/runs/{people.pk}/twin/").status_code in (403, 404)
    assert Run.objects.count() == 2
    auto = make_run(owner=owner, name="automatic", feedback={"mode": "auto"})
    assert f'/runs/{auto.pk}/twin/' not in client.get(f"/runs/{auto.pk}/").content.decode()


def test_labels_on_a_twin_are_refused_at_every_door_naming_why(pair: tuple[Run, Run], owner: User) -> None:
    people, twin = pair
    run_transition(run=twin, action="start", actor=owner)
    members = make_experiences(twin, groups=1, group_size=3, status="pending")
    why = f"run {twin.pk} is the twin of run {people.pk}: it takes no labels"
    # The service every door calls.
    with pytest.raises(FeedbackClosed, match=why):
        feedback_rate(run=twin, experience=members[0], score=4, author=owner)
    # Its queue hands nothing out, and the annotation page says why.
    assert assignment_claim(run=twin, annotator=owner, size=4) == []
    client = logged_in(owner)
    page = client.get(f"/runs/{twin.pk}/annotate/").content.decode()
    assert why.capitalize() in page and 'data-assignment="' not in page
    # The page's forms: a ranking and a correction.
    ranks = {f"rank_{m.pk}": str(i + 1) for i, m in enumerate(members)}
    rank = client.post(f"/runs/{twin.pk}/annotate/experiences/{members[0].pk}/rank/", ranks)
    assert rank.status_code == 400 and why in rank.content.decode()
    edit = client.post(f"/runs/{twin.pk}/annotate/experiences/{members[0].pk}/edit/", {"text": "better"})
    assert edit.status_code == 400 and why in edit.content.decode()
    # The REST API: a 409 naming why; the run says it takes no feedback.
    _, raw = api_key_create(name="env", runs=[twin], actions=["feedback", "read"], rate_limit_per_minute=100)
    response = Client().post(f"/api/v1/runs/{twin.pk}/feedback", json.dumps(
        {"kind": "rating", "experience_id": members[0].pk, "score": 4}), content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert response.status_code == 409 and why in response.json()["detail"]
    assert Client().get(f"/api/v1/runs/{twin.pk}", HTTP_AUTHORIZATION=f"Bearer {raw}").json()["takes_feedback"] is False
    # The CLI: a non-zero exit with the same words.
    with pytest.raises(CommandError, match=why):
        call_command("rft", "feedback", str(twin.pk), "rating", "--as", owner.username, "--experience",
                     str(members[0].pk), "--score", "4", stdout=StringIO(), stderr=StringIO())
    # Its feedback settings stay off.
    edit = client.post(f"/runs/{twin.pk}/feedback-settings/", {"confirm": "yes", "feedback.mode": "blend"})
    assert why in edit.content.decode() and Run.objects.get(pk=twin.pk).cfg.feedback.mode == "auto"
    assert not Feedback.objects.filter(run=twin).exists()


def test_a_twin_made_before_its_run_started_starts_with_it(owner: User) -> None:
    people = make_run(owner=owner, taskset=make_taskset(owner=owner), name="taught", **TAUGHT)
    twin = run_twin_create(run=people, actor=owner)
    response = logged_in(owner).post(f"/runs/{people.pk}/control/start/", {"confirm": "yes"})
    assert response.status_code == 302
    assert Run.objects.get(pk=twin.pk).status == Run.Status.RUNNING
    # And from the CLI.
    other = make_run(owner=owner, taskset=make_taskset(owner=owner), name="other", **TAUGHT)
    other_twin = run_twin_create(run=other, actor=owner)
    out = StringIO()
    call_command("rft", "start", str(other.pk), stdout=out, stderr=StringIO())
    assert Run.objects.get(pk=other_twin.pk).status == Run.Status.RUNNING
    assert f"run {other_twin.pk} (its twin, without people) is running" in out.getvalue()


def test_rft_demo_makes_the_demo_runs_twin_once(demo_model_dir: Path, settings: Any) -> None:
    """`make run` shows people's effect without a click: the demo's twin is made with it (and
    starts with it: test_a_twin_made_before_its_run_started_starts_with_it)."""
    settings.RFT_DEMO_MODEL_DIR, settings.DEBUG = str(demo_model_dir), True
    out = StringIO()
    call_command("rft_demo", "--password", "pw", stdout=out, stderr=StringIO())
    call_command("rft_demo", "--password", "pw", stdout=StringIO(), stderr=StringIO())  # idempotent: one twin
    people = Run.objects.get(name=DEMO_RUN)
    twin = Run.objects.get(twin_of=people)
    assert twin.status == Run.Status.DRAFT and twin.name == f"{DEMO_RUN} (without people)"
    assert twin.cfg.feedback.mode == "auto" and not twin.cfg.reward_model.enabled
    assert twin.cfg.eval == people.cfg.eval and twin.cfg.seed == people.cfg.seed
    assert f"Its twin, run #{twin.pk}" in out.getvalue() and "starts with the demo run" in out.getvalue()
    # What the run page's held-out figures count, beside the build's greedy figure (issue 64):
    # recomputed from the config and the held-out taskset's rows.
    ev = people.cfg.eval
    assert ev.taskset is not None
    held_out = Task.objects.filter(taskset_id=ev.taskset).count()
    tasks = min(ev.max_tasks, held_out)
    assert (f"run page's held-out figures: {tasks} tasks × {ev.n} samples, sampled at temperature "
            f"{ev.sampling.temperature:g} (the first {tasks} of the {held_out} held-out problems; the build's "
            f"figure above is greedy on all {held_out})") in out.getvalue()
