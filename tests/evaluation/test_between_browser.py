"""In a real browser against a real server: an annotator of a run whose blind evaluation is
shown between annotation items (placement "between", issue 63 item 2) meets a blind pair after
their third item, at a phone's width (390 px: the answers stacked) and a laptop's (1280 px:
side by side), votes on it with the keyboard (j to reach it, a / x to vote) between ratings
given by the keyboard too, and nothing of the pairs or their requests and answers says which
version is which (the page names its run, as any annotation page: its items' URLs)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import expect

from apps.evaluation.models import Evaluation, Vote
from apps.feedback.models import Feedback
from tests.evaluation.test_between import between_run
from tests.servers import BROWSER_WAIT_MS, login

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def version_leaks(text: str, evaluation: Evaluation) -> list[str]:
    """What could tell the pair's versions apart: their names, a step, the word version."""
    patterns = [rf"\bv{e.number}\b" for e in evaluation.entrants.all()] + [
        r"\bstep\b", r"\bversions?\b", r"/nowhere/", r"\bbaseline\b", r"\bentrant", r"\bis_check\b"]
    return [m for p in patterns for m in re.findall(p, text, flags=re.I)]


def run_leaks(text: str, evaluation: Evaluation) -> list[str]:
    """The run named: what a pair's card and its exchanges must not carry either."""
    run = evaluation.run
    return [m for p in (rf"/runs/{run.pk}\b", rf"\brun[ _#-]?{run.pk}\b", re.escape(run.name))
            for m in re.findall(p, text, flags=re.I)]


@pytest.mark.parametrize("width", [390, 1280])
def test_an_annotator_votes_blind_between_items_by_keyboard(browser: Any, live_url: str, owner: User,
                                                            annotator: User, width: int) -> None:
    run, evaluation = between_run(owner, annotator)
    context = browser.new_context(base_url=live_url, viewport={"width": width, "height": 800})
    page = context.new_page()
    page.set_default_timeout(BROWSER_WAIT_MS)
    exchanged: list[str] = []

    def vote_by(key: str) -> None:
        """Press `key` and keep the vote's request and answer (the cards' one address)."""
        with page.expect_response(lambda r: "/vote/" in r.url) as answered:
            page.keyboard.press(key)
        response = answered.value
        exchanged.append(response.url + "\n" + (response.request.post_data or "") + "\n" + response.text())

    try:
        login(page, live_url, "annotator", next_path=f"/runs/{run.pk}/annotate/")
        page.goto(f"/runs/{run.pk}/annotate/")
        # A pair after the third item, and one after the sixth.
        queue = page.locator("#queue > article")
        expect(queue).to_have_count(8)
        classes = [queue.nth(i).get_attribute("class") or "" for i in range(8)]
        assert ["blind-item" in c for c in classes] == [False] * 3 + [True] + [False] * 3 + [True]
        assert version_leaks(page.content(), evaluation) == []
        cards = page.locator("#queue article.blind-item")
        for i in range(2):
            html = cards.nth(i).evaluate("el => el.outerHTML")
            assert version_leaks(html, evaluation) == [] and run_leaks(html, evaluation) == []
        first = cards.nth(0)
        a, b = first.locator(".ab > section").all()
        box_a, box_b = a.bounding_box(), b.bounding_box()
        assert box_a is not None and box_b is not None
        if width < 700:  # stacked on a phone
            assert box_b["y"] >= box_a["y"] + box_a["height"] - 1
        else:  # side by side
            assert abs(box_a["y"] - box_b["y"]) < 2 and box_b["x"] > box_a["x"] + box_a["width"] - 1
        # Rate the first item by keys, then j to the pair and vote "A is better" with a.
        expect(page.locator("#queue article.item.current")).to_have_count(1)
        page.keyboard.press("4")
        page.keyboard.press("Enter")
        expect(page.locator("#queue article.item.done:not(.blind-item)")).to_have_count(1)
        page.keyboard.press("j")
        page.keyboard.press("j")
        expect(first).to_have_class(re.compile(r"\bcurrent\b"))
        vote_by("a")
        expect(first).to_contain_text("A is better: counted. Evaluation vote: not trained.")
        expect(first).to_have_class(re.compile(r"\bdone\b"))
        # The second pair: both bad, with x.
        second = page.locator("#queue article.blind-item:not(.done)")
        for _ in range(6):
            if "current" in (second.get_attribute("class") or ""):
                break
            page.keyboard.press("j")
        expect(second).to_have_class(re.compile(r"\bcurrent\b"))
        vote_by("x")
        expect(page.locator("#queue article.blind-item.done")).to_have_count(2)
        votes = list(Vote.objects.filter(voter=annotator).order_by("created_at"))
        assert [v.choice for v in votes] == ["left", "both_bad"]
        assert Feedback.objects.filter(author=annotator).count() == 1  # the rating; the votes are no feedback
        assert len(exchanged) == 2 and all(version_leaks(t, evaluation) == [] and run_leaks(t, evaluation) == []
                                           for t in exchanged), [t[:300] for t in exchanged]
        # The person's ledger: "your submissions" says what the votes are.
        page.goto(f"/runs/{run.pk}/annotate/mine/")
        expect(page.locator('[data-not-trained="evaluation vote"]')).to_contain_text("2 evaluation votes: not trained")
    finally:
        context.close()
