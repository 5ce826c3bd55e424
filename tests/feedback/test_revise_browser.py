"""Revise from "your submissions" (/runs/N/annotate/mine/, issue 45 item 4), in a real browser:
the button works on that page (it had no #mine-box to swap into: htmx:targetError), the
revised label is saved and shown, and no Revise is offered where nothing can change (a run
that finished, failed or was stopped; a label whose group trained)."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from playwright.sync_api import expect

from apps.buffer.models import Experience
from apps.buffer.services import experience_write
from apps.feedback.models import Feedback
from apps.feedback.services import assignment_claim
from apps.runs.models import Run
from tests.factories import add_member, experience_row, make_run
from tests.servers import login

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def _rated_run(owner: User, annotator: User) -> tuple[Run, list[Experience]]:
    run = make_run(owner=owner, feedback={"mode": "blend", "w_auto": 0.5, "w_human": 0.5, "overlap": 1})
    add_member(run, annotator)
    rows = [experience_row(run, key=f"g-{i}", group="g", status="pending", reward=None, auto_reward=1.0,
                           response_text=f"Answer {i}") for i in range(2)]
    members = list(Experience.objects.filter(pk__in=experience_write(experiences=rows).ids).order_by("id"))
    web = Client()
    web.force_login(annotator)
    for a in assignment_claim(run=run, annotator=annotator, size=2):
        assert web.post(f"/runs/{run.pk}/annotate/items/{a.pk}/rate/", {"score": "2"}).status_code == 302
    return run, members


@pytest.mark.parametrize("width", [390, 1280])
def test_revise_on_my_submissions_page_saves_and_shows_the_revised_label(
        browser: Any, live_url: str, owner: User, annotator: User, width: int) -> None:
    run, members = _rated_run(owner, annotator)
    first = Feedback.objects.get(experience=members[0])
    context = browser.new_context(base_url=live_url, viewport={"width": width, "height": 800})
    page = context.new_page()
    page.set_default_timeout(20_000)
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    try:
        mine = f"/runs/{run.pk}/annotate/mine/"
        login(page, live_url, "annotator", next_path=mine)
        page.wait_for_url(f"**{mine}")
        item = page.locator(f'#mine li.submission[data-feedback="{first.pk}"]')
        expect(item).to_contain_text("2/5")
        item.get_by_role("button", name="Revise").click()
        expect(page.locator("#mine .saved")).to_contain_text(f"Withdrawn: your rating on #{members[0].pk}")
        assert not [e for e in errors if "targetError" in e or "htmx" in e], errors
        assert not Feedback.objects.filter(pk=first.pk).exists()
        assert page.url.endswith(mine)  # swapped in place, not a reload
        # Back to the queue, where the item waits open; rated again, the list shows the new label.
        page.get_by_role("link", name="Rate it again in your queue").click()
        page.wait_for_selector("#annotate[data-live=open]")
        card = page.locator(f'#queue .item:not(.done)[data-experience="{members[0].pk}"]')
        card.locator("input[name=score][value='5']").check()
        card.locator("form.rate button[type=submit]").click()
        expect(page.locator(f'#queue .item.done[data-experience="{members[0].pk}"]')).to_contain_text("5/5")
        revised = Feedback.objects.get(experience=members[0])
        assert revised.value["score"] == 5 and revised.pk != first.pk
        assert Experience.objects.get(pk=members[0].pk).human_reward == 1.0
        page.goto(mine)
        expect(page.locator(f'#mine li.submission[data-feedback="{revised.pk}"]')).to_contain_text("5/5")
    finally:
        context.close()


@pytest.mark.parametrize("status", ["finished", "failed", "stopped"])
def test_no_revise_where_nothing_can_change(page: Any, live_url: str, owner: User, annotator: User,
                                             status: str) -> None:
    run, members = _rated_run(owner, annotator)
    mine = f"/runs/{run.pk}/annotate/mine/"
    login(page, live_url, "annotator", next_path=mine)
    page.wait_for_url(f"**{mine}")
    expect(page.locator("#mine li.submission button")).to_have_count(2)
    Run.objects.filter(pk=run.pk).update(status=status)
    page.reload()
    expect(page.locator("#mine li.submission")).to_have_count(2)
    expect(page.locator("#mine li.submission button")).to_have_count(0)
    expect(page.locator("#mine li.submission .final").first).to_have_text(f"run {status}")
    # The door refuses too, and the label stays.
    web = Client()
    web.force_login(annotator)
    fb = Feedback.objects.get(experience=members[0])
    response = web.post(mine, {"feedback": fb.pk}, HTTP_HX_REQUEST="true")
    assert response.status_code == 400 and "takes no more feedback" in response.content.decode()
    assert Feedback.objects.filter(pk=fb.pk).exists()


def test_no_revise_on_a_label_whose_group_trained(page: Any, live_url: str, owner: User, annotator: User) -> None:
    run, members = _rated_run(owner, annotator)
    Experience.objects.filter(pk__in=[m.pk for m in members]).update(status="consumed")
    mine = f"/runs/{run.pk}/annotate/mine/"
    login(page, live_url, "annotator", next_path=mine)
    page.wait_for_url(f"**{mine}")
    expect(page.locator("#mine li.submission")).to_have_count(2)
    expect(page.locator("#mine li.submission button")).to_have_count(0)
    expect(page.locator("#mine li.submission .final").first).to_have_text("trained on")
