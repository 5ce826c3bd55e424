"""The run page's "Labelling progress" follows labels live (issue 45, item 1): an annotator's
labels move the owner's open page without a reload, to the figures the rows give, computed
here from the assignment and feedback rows themselves (not through the page's selector)."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from playwright.sync_api import expect

from apps.buffer.models import Experience
from apps.buffer.services import experience_write
from apps.feedback.models import Assignment, Feedback
from apps.feedback.handout.lease import assignment_claim
from apps.runs.models import Run
from tests.factories import add_member, experience_row, make_run
from tests.servers import login_to_runs

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

_OPEN = ("pending", "ready")
_LIVE = ("leased", "done")


def _progress_from_rows(run: Run) -> tuple[int, int]:
    """(slots labelled, percent of the job) straight from the rows: a labelled slot is a done
    assignment; what remains is, per open item, its leased assignments plus its overlap slots
    no live assignment holds."""
    assignments = list(Assignment.objects.filter(run=run).values_list("experience_id", "status"))
    done = sum(1 for _, status in assignments if status == "done")
    overlap = run.cfg.feedback.overlap
    remaining = 0
    for pk in Experience.objects.filter(run=run, is_expert=False, status__in=_OPEN).values_list("pk", flat=True):
        mine = [status for exp, status in assignments if exp == pk]
        remaining += mine.count("leased") + max(0, overlap - sum(1 for s in mine if s in _LIVE))
    total = done + remaining
    return done, round(100 * done / total) if total else 0


def test_labelling_progress_moves_live_with_each_label(page: Any, live_url: str, owner: User,
                                                       annotator: User) -> None:
    run = make_run(owner=owner, feedback={"mode": "blend", "overlap": 1})
    add_member(run, annotator)
    rows = [experience_row(run, key=f"g-{i}", group="g", status="pending", reward=None, auto_reward=0.5,
                           response_text=f"answer {i}") for i in range(4)]
    experience_write(experiences=rows)
    items = assignment_claim(run=run, annotator=annotator, size=4)
    assert len(items) == 4

    login_to_runs(page, owner.username)
    page.goto(f"/runs/{run.pk}/")
    page.wait_for_selector("#live[data-state=live]")
    totals = page.locator("#labelling-totals")
    expect(totals.locator(".done")).to_have_text("0")
    expect(page.locator("#labelling")).to_contain_text("0%")

    web = Client()
    web.force_login(annotator)
    for n, a in enumerate(items[:3], start=1):
        assert web.post(f"/runs/{run.pk}/annotate/items/{a.pk}/rate/", {"score": "4"}).status_code == 302
        done, percent = _progress_from_rows(run)
        assert done == n
        # The page follows without a reload: the figure the rows give, and the person's labels.
        expect(totals.locator(".done")).to_have_text(str(done), timeout=20_000)
        expect(page.locator("#labelling progress")).to_have_attribute("value", str(percent))
        expect(page.locator("#labelling")).to_contain_text(f"{percent}%")
        labels = Feedback.objects.filter(run=run, author=annotator, kind="rating").count()
        expect(page.locator('#labelling tr[data-person="annotator"] .labels')).to_have_text(str(labels))
    assert _progress_from_rows(run) == (3, 75)
    # A reload shows what the page already showed.
    page.reload()
    expect(totals.locator(".done")).to_have_text("3")
    expect(page.locator("#labelling")).to_contain_text("75%")


def test_the_labelling_panel_is_the_owners(owner: User, annotator: User) -> None:
    run = make_run(owner=owner, feedback={"mode": "blend", "overlap": 1})
    add_member(run, annotator)
    mine = Client()
    mine.force_login(owner)
    assert mine.get(f"/runs/{run.pk}/labelling/", HTTP_HX_REQUEST="true").status_code == 200
    theirs = Client()
    theirs.force_login(annotator)
    assert theirs.get(f"/runs/{run.pk}/labelling/", HTTP_HX_REQUEST="true").status_code == 403
