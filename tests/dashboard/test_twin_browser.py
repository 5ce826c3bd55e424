"""The twin in a browser (issue #64 item 6): the owner copies a run without people from its
page and lands on a twin page that contradicts nothing: the flash says it takes no labels and
starts with its run, the page names what it changed, and nothing on it invites a label; its
annotation page says why nothing waits there, and a rating posted anyway is refused."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import expect

from apps.feedback.models import Feedback
from apps.runs.models import Run
from tests.factories import make_experiences, make_run, make_taskset
from tests.servers import BROWSER_WAIT_MS, login_to_runs

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_the_twin_page_invites_no_label_and_its_annotation_page_says_why(page: Any, live_url: str,
                                                                        owner: User) -> None:
    people = make_run(owner=owner, taskset=make_taskset(owner=owner), name="taught",
                      feedback={"mode": "learned"}, reward_model={"enabled": True})
    login_to_runs(page, owner.username)
    page.goto(f"/runs/{people.pk}/")
    page.get_by_role("link", name="Copy without people").click()
    page.get_by_role("button", name="Make the twin").click()
    twin = Run.objects.get(twin_of=people)
    page.wait_for_url(f"**/runs/{twin.pk}/")
    body = page.locator("body")
    expect(body).to_contain_text("it takes no labels; it starts when you start taught.", timeout=BROWSER_WAIT_MS)
    assert "beside it" not in page.inner_text("body")
    expect(page.locator("#twin-differences")).to_contain_text("feedback.mode")
    expect(page.locator("#twin-differences")).to_contain_text("reward_model.enabled")
    expect(page.locator("#twin-no-feedback")).to_be_visible()
    for absent in ("a.annotate-link", ".waiting-tag", "#run-ledger", "#feedback-settings", "#human-loop-hint"):
        assert page.locator(absent).count() == 0, absent
    assert "waiting for you" not in page.inner_text("body") and "wait for people" not in page.inner_text("body")

    make_experiences(twin, groups=1, group_size=2, status="pending")
    page.goto(f"/runs/{twin.pk}/annotate/")
    expect(page.locator("#annotate-closed")).to_contain_text(
        f"is the twin of run {people.pk}: it takes no labels", timeout=BROWSER_WAIT_MS)
    assert page.locator("#queue .item").count() == 0
    assert not Feedback.objects.filter(run=twin).exists()
