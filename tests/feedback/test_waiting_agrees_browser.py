""""N waiting for you" and the annotation queue agree (issue 45, item 2): the header said
"117 waiting for you" beside "Nothing to annotate right now", and "Load new items" brought
nothing. The count read every open item; the queue's claim hands a new rater gold items only
until they are measured, and an untrusted one (at untrusted_share 0) nothing fresh. Both now
read one selector (apps.feedback.handout.rule.annotation_handout), checked here in those states
in a real browser: what the header says waits is what the queue holds once "Load new items"
has asked for more."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from playwright.sync_api import expect

from apps.buffer.models import Experience
from apps.buffer.services import experience_write
from apps.feedback.models import Assignment
from apps.feedback.raters.reliability import rater_standing
from apps.feedback.handout.queue import annotation_waiting
from apps.rewards.models import GoldItem
from apps.runs.models import Run
from tests.factories import add_member, experience_row, make_run, make_user
from tests.servers import BROWSER_WAIT_MS, login

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def _trust_run(owner: User) -> tuple[Run, set[int], set[int]]:
    """A run that hands a new rater 3 gold items first and an untrusted one nothing fresh:
    five groups of 4 fresh completions, and 6 gold items whose right rating is 1."""
    run = make_run(owner=owner, reward_model={"enabled": True}, feedback={
        "mode": "blend", "overlap": 1, "rater_weighting": "gold", "gold_rate": 0.2,
        "trust": {"gold_first": 3, "untrusted_share": 0.0}})
    rows = [experience_row(run, key=f"g{g}-{i}", group=f"g{g}", status="pending", reward=None, auto_reward=0.5,
                           response_text=f"answer {g}.{i}") for g in range(5) for i in range(4)]
    rows += [experience_row(run, key=f"solo{k}", group=f"solo{k}", status="pending", reward=None, auto_reward=0.5,
                            response_text=f"solo answer {k}") for k in range(6)]
    exps = list(Experience.objects.filter(pk__in=experience_write(experiences=rows).ids).order_by("id"))
    fresh, gold = exps[:-6], exps[-6:]
    for e in gold:
        GoldItem.objects.create(run=run, experience=e, answer=0.0, created_by=owner)
    return run, {e.pk for e in fresh}, {e.pk for e in gold}


def _rate_queue_wrongly(run: Run, user: User) -> None:
    """`user` opens the annotation page (which hands out their queue) and rates every item 5."""
    web = Client()
    web.force_login(user)
    assert web.get(f"/runs/{run.pk}/annotate/").status_code == 200
    for a in Assignment.objects.filter(run=run, annotator=user, status="leased"):
        assert web.post(f"/runs/{run.pk}/annotate/items/{a.pk}/rate/", {"score": "5"}).status_code == 302


def _page_agrees(browser: Any, live_url: str, run: Run, user: User, width: int) -> tuple[int, int]:
    """Open the annotation page as `user`, ask for new items, and return (the header's waiting
    count, the open items in the queue)."""
    context = browser.new_context(base_url=live_url, viewport={"width": width, "height": 800})
    page = context.new_page()
    page.set_default_timeout(BROWSER_WAIT_MS)
    try:
        path = f"/runs/{run.pk}/annotate/"
        login(page, live_url, user.username, next_path=path)
        page.wait_for_url(f"**{path}")
        page.wait_for_selector("#annotate[data-live=open]")
        with page.expect_response(lambda r: "/annotate/queue/" in r.url):
            page.click("#load-more")
        open_items = page.locator("#queue .item:not(.done)")
        waiting = int(page.inner_text("#waiting-count"))
        expect(open_items).to_have_count(waiting)
        if waiting == 0:
            expect(page.locator("#queue-empty")).to_be_visible()
        else:
            expect(page.locator("#queue-empty")).to_be_hidden()
        return waiting, open_items.count()
    finally:
        context.close()


@pytest.mark.parametrize("width", [390, 1280])
def test_the_waiting_count_is_what_the_queue_can_hold(browser: Any, live_url: str, owner: User, width: int) -> None:
    run, fresh, gold = _trust_run(owner)
    carol, randy = make_user("carol"), make_user("randy")
    add_member(run, carol)
    add_member(run, randy)

    # A new rater: the queue holds her first 3 gold items and nothing else until she is
    # measured, and the header says 3 (it said 26: every open item, gold ones too).
    waiting, shown = _page_agrees(browser, live_url, run, carol, width)
    assert (waiting, shown) == (3, 3)
    assert {a.experience_id for a in Assignment.objects.filter(run=run, annotator=carol)} <= gold

    # An untrusted rater (every gold item wrong: the first 3, then the 3 an untrusted rater
    # gets before anything else) at untrusted_share 0: nothing fresh is handed to him, so
    # nothing waits for him, though the fresh items still wait for others.
    _rate_queue_wrongly(run, randy)
    _rate_queue_wrongly(run, randy)
    assert Assignment.objects.filter(run=run, annotator=randy, status="done").count() == 6
    assert rater_standing(run=run, annotator_id=randy.pk) == "untrusted"
    waiting, shown = _page_agrees(browser, live_url, run, randy, width)
    assert (waiting, shown) == (0, 0)
    assert annotation_waiting(run=run, annotator=randy) == 0
    assert not Assignment.objects.filter(run=run, annotator=randy, experience_id__in=fresh).exists()
    # The other doors say the same: the runs list and the run page offer him nothing waiting.
    web = Client()
    web.force_login(randy)
    assert "waiting-tag" not in web.get("/runs/").content.decode()
    # The run page keeps its badge's place for its live refresh, hidden at 0.
    hidden = '<span id="annotate-waiting" class="tag waiting-tag" hidden>0 waiting</span>'
    page = web.get(f"/runs/{run.pk}/").content.decode()
    assert hidden in page and "waiting-tag" not in page.replace(hidden, "")
