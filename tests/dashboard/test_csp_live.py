"""Every page under the Content-Security-Policy in a real browser: the header is sent, and
the browser reports no violation (no inline script or style the policy would block), while
the page's scripts still run (charts drawn, htmx swaps, the annotation queue loads)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User

from apps.runs.metrics import metric_record
from apps.runs.models import Run
from apps.runs.services import run_transition
from tests.factories import add_member, make_experiences, make_run, make_taskset, make_user
from tests.servers import BROWSER_WAIT_MS, login_to_runs

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def csp_page(browser: Any, live_url: str) -> Iterator[tuple[Any, list[str]]]:
    context = browser.new_context(base_url=live_url)
    page = context.new_page()
    page.set_default_timeout(BROWSER_WAIT_MS)
    violations: list[str] = []
    page.on("console", lambda msg: violations.append(f"{page.url}: {msg.text}")
            if "Content Security Policy" in msg.text or "Content-Security-Policy" in msg.text else None)
    yield page, violations
    context.close()


@pytest.fixture
def staff_run() -> tuple[User, Run]:
    owner = make_user("boss", staff=True)
    run = make_run(owner=owner, taskset=make_taskset(owner=owner), name="csp")
    add_member(run, owner)
    run_transition(run=run, action="start", actor=owner)
    for step in (1, 2, 3):
        metric_record(run=run, step=step, values={"reward/mean": 0.1 * step, "loss": 1.0 / step})
    make_experiences(run, groups=1, group_size=2)
    return owner, run


def test_every_page_works_under_the_policy_without_a_violation(csp_page: tuple[Any, list[str]], staff_run: tuple[User, Run]) -> None:
    browser_page, violations = csp_page
    owner, run = staff_run
    response = browser_page.goto("/login/")
    policy = response.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "style-src 'self'" in policy and "frame-ancestors 'none'" in policy
    login_to_runs(browser_page, owner.username)

    browser_page.goto(f"/runs/{run.pk}/")
    # dashboard.js ran: it read the chart data and drew uPlot charts.
    browser_page.wait_for_selector(".uplot")
    # htmx ran: the controls fragment swaps in on click (the confirm dialog accepted).
    browser_page.on("dialog", lambda d: d.accept())

    for path in ("/runs/", "/runs/new/", f"/runs/{run.pk}/experiences/", f"/runs/{run.pk}/export/", "/runs/workers/",
                 f"/runs/{run.pk}/audit/", f"/runs/{run.pk}/timeline/", f"/runs/{run.pk}/keys/", "/api/v1/docs",
                 "/admin/", f"/admin/runs/run/{run.pk}/change/"):
        response = browser_page.goto(path)
        assert response.status == 200, path
        browser_page.wait_for_load_state("networkidle")

    browser_page.goto(f"/runs/{run.pk}/annotate/")
    browser_page.wait_for_load_state("networkidle")
    assert violations == []
