"""All your submissions, paged (issue 64 item 2): the list showed the latest 30 of 48, with no
heading and nothing to reach the rest. Now it has a heading, says "N–M of T", and pages with
plain links that htmx swaps in place (and that work without it)."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from playwright.sync_api import expect

from apps.feedback.kinds.rating import feedback_rate
from apps.feedback.models import Feedback
from apps.runs.models import Run
from tests.factories import add_member, make_experiences, make_run
from tests.servers import login


def _labelled(owner: User, annotator: User, n: int = 48) -> Run:
    run = make_run(owner=owner, name="paged <run>", feedback={"mode": "blend", "overlap": 1})
    add_member(run, annotator)
    for i, e in enumerate(make_experiences(run, groups=n // 4, group_size=4, status="pending")):
        feedback_rate(run=run, experience=e, score=1 + i % 5, author=annotator)
    return run


def _newest_first(run: Run, annotator: User) -> list[int]:
    return list(Feedback.objects.filter(run=run, author=annotator).order_by("-created_at", "-id").values_list("pk", flat=True))


@pytest.mark.django_db
def test_the_list_pages_and_a_bad_page_is_a_clear_400(owner: User, annotator: User) -> None:
    run = _labelled(owner, annotator)
    web = Client()
    web.force_login(annotator)
    mine = f"/runs/{run.pk}/annotate/mine/"
    last = web.get(mine, {"page": "9"}).content.decode()  # past the last: the last
    assert "31–48 of 48, newest first" in last and "page 2 of 2" in last
    bad = web.get(mine, {"page": "two"})
    assert bad.status_code == 400 and "page is a page number" in bad.content.decode()
    assert "Latest 10 of 48" in web.get(f"/runs/{run.pk}/annotate/").content.decode()


@pytest.mark.browser
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_all_your_submissions_has_a_heading_a_count_and_pages(page: Any, live_url: str, owner: User,
                                                              annotator: User) -> None:
    run = _labelled(owner, annotator)
    order = _newest_first(run, annotator)
    annotate = f"/runs/{run.pk}/annotate/"
    login(page, live_url, "annotator", next_path=annotate)
    page.wait_for_url(f"**{annotate}")
    expect(page.locator("#mine-count")).to_have_text("Latest 10 of 48")
    page.get_by_role("link", name="All your submissions").click()
    expect(page.get_by_role("heading", name="Your submissions on paged <run>")).to_be_visible()
    expect(page.locator("#mine-count")).to_have_text("1–30 of 48, newest first")
    shown = page.locator("#mine li.submission")
    expect(shown).to_have_count(30)
    assert [int(x) for x in shown.evaluate_all("els => els.map(e => e.dataset.feedback)")] == order[:30]
    page.get_by_role("link", name="Older →").click()
    expect(page.locator("#mine-count")).to_have_text("31–48 of 48, newest first")
    expect(shown).to_have_count(18)
    assert [int(x) for x in shown.evaluate_all("els => els.map(e => e.dataset.feedback)")] == order[30:]
    assert page.url.endswith("?page=2")
    page.reload()  # the address says which page
    expect(page.locator("#mine-count")).to_have_text("31–48 of 48, newest first")
    page.get_by_role("link", name="← Newer").click()
    expect(page.locator("#mine-count")).to_have_text("1–30 of 48, newest first")
