"""The run page's headline, every version downloadable, and evaluation figures that say what
they count (issue 64). Each figure is recomputed here from the metric, vote and answer rows
(tests/dashboard/headline_rows.py), not read back from the code that shows it."""

from __future__ import annotations

import re
from io import StringIO

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client
from django.utils.html import escape

from apps.envapi.services import api_key_create
from apps.runs.models import Run
from tests.dashboard.headline_rows import (ACCURACY, HOSTILE, STEPS, TASKS, TWIN_WORKING, WORKING, change, difference_interval,
                                           interval, taught_run, v3_wins, wilson)
from tests.factories import make_run, make_user

pytestmark = pytest.mark.django_db


def client_of(user: User) -> Client:
    c = Client()
    c.force_login(user)
    return c


def section(page: str, anchor: str) -> str:
    start = page.index(anchor)
    return page[start:page.index("</section>", start)]


def f3(x: float) -> str:
    return f"{x:.3f}"


def test_the_headline_leads_with_the_taught_share_the_twin_the_blind_verdict_and_answers(owner: User,
                                                                                          annotator: User) -> None:
    taught = taught_run(owner, annotator)
    page = client_of(owner).get(f"/runs/{taught.run.pk}/").content.decode()
    # It comes before the summary, the ledger and the charts.
    assert page.index('id="headline"') < page.index('id="charts"')
    head = section(page, 'id="headline"')
    assert "What people teach" in head and "in the guidelines' style (<code>working</code>)" in head
    # Version 0 -> the newest evaluated (v3 at step 6), each with its interval over its tasks.
    low0, high0 = interval(WORKING[0], TASKS[0])
    low3, high3 = interval(WORKING[3], TASKS[3])
    assert f'data-figure="start">{f3(WORKING[0])}</b>' in head
    assert f'data-figure="start-interval">[{f3(low0)}, {f3(high0)}]' in head
    assert f'data-figure="now">{f3(WORKING[3])}</b>' in head
    assert f'data-figure="now-interval">[{f3(low3)}, {f3(high3)}]' in head
    assert "v3, train step 6" in head
    moved, low, high, words = change(WORKING[0], TASKS[0], WORKING[3], TASKS[3])
    assert (f'data-figure="change">+{f3(moved)}</b> <small data-figure="change-interval">[{f3(low)}, {f3(high)}]</small>: '
            f'<span data-figure="change-words">{words}</span>') in head
    assert words == "rose"
    assert (f"v0 on {TASKS[0]} held-out tasks, v3 on {TASKS[3]}, 2 samples a task, sampled at temperature 1; "
            "[95% interval over the tasks]") in head
    # The twin's beside it: the comparison's figures over the steps both evaluated.
    difference, low, high = difference_interval((WORKING[0], WORKING[3], TWIN_WORKING[0], TWIN_WORKING[3]),
                                                (TASKS[0], TASKS[3], TASKS[0], TASKS[3]))
    twin = head[head.index('id="headline-twin"'):]
    assert f'data-figure="twin">{f3(TWIN_WORKING[0])} → {f3(TWIN_WORKING[3])}</b>' in twin
    assert f'data-figure="difference">+{f3(difference)}</b>' in twin
    assert f'data-figure="difference-interval">[{f3(low)}, {f3(high)}]' in twin
    # The comparison below says what its evaluations counted too.
    assert f'id="twin-basis">{TASKS[3]} tasks × 2 samples, sampled at temperature 1<' in page
    # The blind verdict from the vote rows: v3's points over v0, the Wilson interval, the words.
    wins, n = v3_wins(taught.evaluation)
    wl, wh = wilson(wins, n)
    blind = head[head.index('id="headline-blind"'):]
    assert f'data-figure="win-rate">{f3(wins / n)}</b>' in blind
    assert f'data-figure="interval">[{f3(wl)}, {f3(wh)}]' in blind and f"over {n} votes" in blind
    assert "too few votes to tell" in blind  # 4 votes cannot tell
    # Three prompts answered by v0 and by v3, side by side, model output escaped.
    answers = head[head.index('id="headline-answers"'):]
    assert answers.count('class="answer-pair"') == 3
    assert "Held-out prompts: version 0 and v3" in answers
    assert "<script>window.pwned" not in page
    assert escape(HOSTILE) in answers
    pairs = re.findall(r'<p class="answer-prompt">What is (\d) \+ \d\?</p>.*?data-side="start">(.*?)</pre>.*?'
                       r'data-side="newest">(.*?)</pre>', answers, re.S)
    assert len(pairs) == 3
    for number, start, newest in pairs:
        assert start == f"v0 says {2 * int(number)}" and newest.startswith("v3 says ")


def test_without_a_twin_votes_or_answers_the_headline_says_so(owner: User) -> None:
    run = make_run(owner=owner, name="alone")
    page = client_of(owner).get(f"/runs/{run.pk}/").content.decode()
    head = section(page, 'id="headline"')
    assert "How the held-out figures moved" in head and "has no held-out evaluation" in head
    assert "No twin:" in head and "No blind evaluation has votes yet" in head
    assert 'id="headline-no-answers"' in head and "No held-out answers are stored yet" in head


def test_every_version_is_listed_with_the_best_by_the_metric_picked(owner: User, annotator: User) -> None:
    taught = taught_run(owner, annotator)
    c = client_of(owner)
    page = c.get(f"/runs/{taught.run.pk}/").content.decode()
    panel = page[page.index('id="versions"'):page.index('id="charts"')]
    # The taught preference is offered first and chooses by default; the choice is named.
    options = re.findall(r'<option value="([^"]+)"', panel)
    assert options[0] == "eval/preference/working" and "eval/accuracy" in options
    best = max(range(4), key=lambda v: (WORKING[v], -v))
    assert f"best by preference share: working: v{best}" in panel
    rows = re.findall(r'<tr data-of-version="(\d+)"', panel)
    assert rows == ["3", "2", "1", "0"]  # every published version, the newest first
    for v in (1, 2, 3):
        assert f'action="/runs/{taught.run.pk}/weights/{v}/"' in panel  # each trained one can be prepared
    low, high = interval(WORKING[2], TASKS[2])
    assert f"{f3(WORKING[2])} <small>[{f3(low)}, {f3(high)}]</small>" in panel
    # Picked: accuracy.
    picked = c.get(f"/runs/{taught.run.pk}/versions/", {"best_by": "eval/accuracy"}, HTTP_HX_REQUEST="true").content.decode()
    by_accuracy = max(range(4), key=lambda v: (ACCURACY[v], -v))
    assert f"best by accuracy (the domain&#x27;s verifier): v{by_accuracy}" in picked
    assert "picked on this page" in picked
    # A metric the run has no series of: a 400 naming the field.
    refused = c.get(f"/runs/{taught.run.pk}/versions/", {"best_by": "eval/nonsense"})
    assert refused.status_code == 400 and "best_by must be one of" in refused.content.decode()
    assert c.get(f"/runs/{taught.run.pk}/", {"best_by": "eval/nonsense"}).status_code == 400
    # Someone who may not see the run learns nothing from the panel.
    stranger = client_of(make_user("stranger"))
    assert stranger.get(f"/runs/{taught.run.pk}/versions/").status_code == 404
    assert stranger.post(f"/runs/{taught.run.pk}/weights/2/", {"panel": "versions"}).status_code == 404


def test_the_summary_lists_every_version_and_says_what_its_figures_count(owner: User, annotator: User) -> None:
    taught = taught_run(owner, annotator, status=Run.Status.FINISHED)
    summary = client_of(owner).get(f"/runs/{taught.run.pk}/summary/").content.decode()
    assert 'id="versions"' in summary and "Every version" in summary
    assert "each evaluation on 60 tasks × 2 samples, sampled at temperature 1" in summary
    row = re.search(r'<tr data-metric="eval/accuracy"[^>]*>(.*?)</tr>', summary, re.S)
    assert row is not None
    start, end = interval(ACCURACY[0], TASKS[0]), interval(ACCURACY[3], TASKS[3])
    assert f'data-figure="start-interval">[{f3(start[0])}, {f3(start[1])}]' in row.group(1)
    assert f'data-figure="end-interval">[{f3(end[0])}, {f3(end[1])}]' in row.group(1)
    moved, low, high, words = change(ACCURACY[0], TASKS[0], ACCURACY[3], TASKS[3])
    assert f'data-figure="change-interval">[{f3(low)}, {f3(high)}]</small> <em data-figure="change-words">{words}</em>' in row.group(1)
    assert words == "no clear change"  # 0.2 -> 0.1 on 64 and 60 tasks is within the noise
    reward = re.search(r'<tr data-metric="eval/reward_mean"[^>]*>(.*?)</tr>', summary, re.S)
    assert reward is not None and "interval" not in reward.group(1)  # a reward is no share


def test_the_api_and_the_cli_say_what_the_figures_count(owner: User, annotator: User) -> None:
    taught = taught_run(owner, annotator)
    _, raw = api_key_create(name="reader", runs=[taught.run], actions=["read"], rate_limit_per_minute=100)
    body = Client().get(f"/api/v1/runs/{taught.run.pk}/evaluation", HTTP_AUTHORIZATION=f"Bearer {raw}").json()
    assert body["tasks"] == TASKS[-1] and body["samples"] == 2 and body["greedy"] is False
    assert body["basis"] == "60 tasks × 2 samples, sampled at temperature 1"
    accuracy = next(s for s in body["series"] if s["name"] == "eval/accuracy")
    assert (accuracy["start_tasks"], accuracy["end_tasks"]) == (TASKS[0], TASKS[3])
    assert accuracy["start_interval"] == pytest.approx(list(interval(ACCURACY[0], TASKS[0])))
    assert accuracy["end_interval"] == pytest.approx(list(interval(ACCURACY[3], TASKS[3])))
    moved, low, high, words = change(ACCURACY[0], TASKS[0], ACCURACY[3], TASKS[3])
    assert accuracy["change_interval"] == pytest.approx([low, high]) and accuracy["change_words"] == words
    reward = next(s for s in body["series"] if s["name"] == "eval/reward_mean")
    assert reward["start_interval"] is None and reward["change_words"] == ""
    # The default best is the taught share's (the run has guidelines).
    assert body["best_by"] == "eval/preference/working" and body["best_version"] == 2
    out = StringIO()
    call_command("rft", "figures", str(taught.run.pk), stdout=out)
    text = out.getvalue()
    assert "held-out evaluation on 60 tasks × 2 samples, sampled at temperature 1" in text
    low, high = interval(ACCURACY[3], TASKS[3])
    moved, clow, chigh, words = change(ACCURACY[0], TASKS[0], ACCURACY[3], TASKS[3])
    assert f"-> {f3(ACCURACY[3])} [{f3(low)}, {f3(high)}] (change {f3(moved)} [{f3(clow)}, {f3(chigh)}]: {words})" in text
    assert "best version: v2, chosen by eval/preference/working" in text and str(STEPS[2]) in text


def test_a_greedy_evaluation_is_named_greedy(owner: User) -> None:
    from apps.runs.metrics import metric_record

    run = make_run(owner=owner, name="greedy", eval={"max_tasks": 200})
    metric_record(run=run, step=0, values={"eval/accuracy": 0.31, "eval/tasks": 200.0, "eval/version": 0.0})
    page = client_of(owner).get(f"/runs/{run.pk}/").content.decode()
    assert '<span id="run-eval-basis">200 tasks, greedy</span>' in page
