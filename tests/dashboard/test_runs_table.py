"""What people expect from Weights & Biases (issue 32 item 5): the runs list as a table one
sorts by a column and filters by status and name, with each run's latest reward, evaluation
accuracy, steps and labels; a person sees only their runs whatever the query says."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from apps.feedback.kinds.rating import feedback_rate
from apps.runs.metrics import metric_record
from apps.runs.models import Run
from tests.factories import add_member, make_experiences, make_run, make_taskset, make_user

pytestmark = pytest.mark.django_db


def a_run(owner: User, name: str, *, reward: float | None = None, accuracy: float | None = None,
          steps: int = 0, status: str = Run.Status.DRAFT) -> Run:
    run = make_run(owner=owner, taskset=make_taskset(owner=owner, name=name), name=name)
    if reward is not None:
        metric_record(run=run, step=1, values={"reward/mean": reward - 0.5})
        metric_record(run=run, step=2, values={"reward/mean": reward})
    if accuracy is not None:
        metric_record(run=run, step=1, values={"eval/accuracy": 0.01})
        metric_record(run=run, step=2, values={"eval/accuracy": accuracy})
    Run.objects.filter(pk=run.pk).update(train_step=steps, status=status)
    run.refresh_from_db()
    return run


def shown(client: Client, query: str = "") -> list[str]:
    """The run names in the table, top to bottom."""
    response = client.get(f"/runs/{query}")
    assert response.status_code == 200, response.content.decode()[-800:]
    return re.findall(r'<tr data-run="\d+"[^>]*>\s*<td><a href="/runs/\d+/">([^<]*)</a>', response.content.decode())


@pytest.fixture
def ada() -> User:
    return make_user("ada")


@pytest.fixture
def ada_runs(ada: User) -> dict[str, Run]:
    runs = {
        "alpha": a_run(ada, "alpha", reward=0.2, accuracy=0.9, steps=30, status=Run.Status.FINISHED),
        "beta": a_run(ada, "beta", reward=0.7, steps=10, status=Run.Status.RUNNING),
        "gamma": a_run(ada, "gamma", reward=0.5, accuracy=0.4, steps=20, status=Run.Status.RUNNING),
    }
    labelled = runs["gamma"]
    for exp in make_experiences(labelled, groups=1, group_size=3)[:3]:
        feedback_rate(run=labelled, experience=exp, score=4, author=ada)
    return runs


def signed_in(client: Client, user: User) -> Client:
    client.force_login(user)
    return client


def test_the_table_shows_each_runs_latest_reward_evaluation_accuracy_steps_and_labels(
        client: Client, ada: User, ada_runs: dict[str, Run]) -> None:
    html = signed_in(client, ada).get("/runs/").content.decode()
    gamma = re.search(rf'<tr data-run="{ada_runs["gamma"].pk}".*?</tr>', html, re.S)
    assert gamma is not None
    row = gamma.group(0)
    assert "0.500" in row  # the latest reward, not the first
    assert re.search(r'class="eval-accuracy">0\.400<', row)
    assert re.search(r'class="labels">3<', row)
    beta = re.search(rf'<tr data-run="{ada_runs["beta"].pk}".*?</tr>', html, re.S)
    assert beta is not None and re.search(r'class="eval-accuracy"><span class="muted">–', beta.group(0))


def test_a_column_header_sorts_the_runs_and_a_second_click_reverses_them(
        client: Client, ada: User, ada_runs: dict[str, Run]) -> None:
    c = signed_in(client, ada)
    assert shown(c) == ["gamma", "beta", "alpha"]  # newest first by default
    assert shown(c, "?sort=name") == ["alpha", "beta", "gamma"]
    assert shown(c, "?sort=-name") == ["gamma", "beta", "alpha"]
    assert shown(c, "?sort=-reward") == ["beta", "gamma", "alpha"]
    assert shown(c, "?sort=-steps") == ["alpha", "gamma", "beta"]
    assert shown(c, "?sort=-labels")[0] == "gamma"
    # A run without an evaluation comes last whichever way one sorts.
    assert shown(c, "?sort=eval") == ["gamma", "alpha", "beta"]
    assert shown(c, "?sort=-eval") == ["alpha", "gamma", "beta"]
    # The header links to the sort it offers: Run sorted ascending links to descending.
    html = c.get("/runs/?sort=name").content.decode()
    assert re.search(r'<th aria-sort="ascending"><a class="sort" data-sort="name" href="\?sort=-name"', html)
    assert 'hx-get="?sort=-name"' in html  # HTMX-enhanced, a plain link underneath


def test_filtering_by_status_and_name_narrows_the_table_and_keeps_the_sort(
        client: Client, ada: User, ada_runs: dict[str, Run]) -> None:
    c = signed_in(client, ada)
    assert shown(c, "?status=running&sort=name") == ["beta", "gamma"]
    assert shown(c, "?q=AMM") == ["gamma"]
    assert shown(c, "?q=a&status=finished") == ["alpha"]
    html = c.get("/runs/?q=zzz").content.decode()
    assert "No runs match" in html and "No runs yet" not in html
    # The headers keep the filter.
    assert 'href="?sort=name&amp;status=running"' in c.get("/runs/?status=running").content.decode()


def test_bad_query_parameters_fall_back_to_the_default_order_not_an_error(
        client: Client, ada: User, ada_runs: dict[str, Run]) -> None:
    c = signed_in(client, ada)
    for query in ("?sort=__class__", "?sort=-", "?sort=--name", "?status=exploded", "?q=" + "x" * 5000,
                  "?sort=name&sort=oops"):
        response = c.get(f"/runs/{query}")
        assert response.status_code == 200, query
    assert c.get("/runs/?sort=%00").status_code == 400  # the site's rule for control characters
    assert shown(c, "?sort=password") == ["gamma", "beta", "alpha"]
    assert shown(c, "?status=exploded") == ["gamma", "beta", "alpha"]


def test_each_person_sorts_and_filters_only_their_own_runs(
        client: Client, ada: User, ada_runs: dict[str, Run]) -> None:
    bob = make_user("bob")
    bobs = a_run(bob, "bobs secret", reward=9.0, steps=99, status=Run.Status.RUNNING)
    annotator = make_user("annie")
    add_member(ada_runs["beta"], annotator)
    assert shown(signed_in(client, bob), "?sort=-reward") == ["bobs secret"]
    assert shown(signed_in(client, annotator), "?sort=-reward&status=running") == ["beta"]
    assert shown(signed_in(client, annotator), "?q=secret") == []
    assert "bobs secret" not in shown(signed_in(client, ada), "?sort=-steps&q=s")
    assert shown(signed_in(client, bob), f"?q={bobs.name}") == ["bobs secret"]


def test_a_run_name_is_escaped_in_the_table_and_the_filter(client: Client, ada: User) -> None:
    a_run(ada, "<script>alert(1)</script>")
    html = signed_in(client, ada).get("/runs/?q=<script>").content.decode()
    assert "<script>alert(1)</script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_htmx_sort_returns_the_table_alone(client: Client, ada: User, ada_runs: dict[str, Any]) -> None:
    response = signed_in(client, ada).get("/runs/?sort=name", HTTP_HX_REQUEST="true", HTTP_HX_TARGET="runs-table")
    html = response.content.decode()
    assert html.lstrip().startswith('<div id="runs-table">') and "<html" not in html
    assert shown(client, "?sort=name") == ["alpha", "beta", "gamma"]


@pytest.mark.browser
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_in_a_browser_a_header_click_sorts_and_the_status_filter_narrows_in_place(page: Any) -> None:
    from tests.servers import login_to_runs

    ada = make_user("ada")
    for name, reward, status in (("alpha", 0.2, Run.Status.FINISHED), ("beta", 0.7, Run.Status.RUNNING),
                                 ("gamma", 0.5, Run.Status.RUNNING)):
        a_run(ada, name, reward=reward, status=status)
    login_to_runs(page, ada.username)

    def names() -> list[str]:
        return [a.inner_text() for a in page.locator("#runs tr[data-run] td:first-child > a").all()]

    assert names() == ["gamma", "beta", "alpha"]
    page.click("th a.sort[data-sort=reward]")
    page.wait_for_url("**/runs/?sort=-reward")
    page.wait_for_function("() => document.querySelector('#runs tr[data-run] a').textContent === 'beta'")
    assert names() == ["beta", "gamma", "alpha"]
    page.select_option("select[name=status]", "running")
    page.wait_for_function("() => document.querySelectorAll('#runs tr[data-run]').length === 2")
    assert names() == ["beta", "gamma"] and "status=running" in page.url and "sort=-reward" in page.url
    page.click("th a.sort[data-sort=reward]")  # again: lowest first, still only running runs
    page.wait_for_function("() => document.querySelector('#runs tr[data-run] a').textContent === 'gamma'")
    assert names() == ["gamma", "beta"]
