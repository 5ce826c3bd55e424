"""Ranking by keyboard (issue 32): a person ranks a group of 8 with the keyboard alone. A
number puts the focused completion at that place and the places never renumber (the next
unranked completion takes focus, under the letter it had from the start); Enter saves once all
are ranked, as the hint says, and does nothing else before. In a real browser against a real
server, at a laptop's width and, by taps, at a phone's."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import expect

from apps.feedback.models import Feedback
from apps.runs.models import Run
from tests.factories import add_member, make_run
from tests.feedback.test_pages_ergonomics import _group, _open
from tests.servers import BROWSER_WAIT_MS, screenshot

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def run_of_eight(owner: User, annotator: User) -> Run:
    run = make_run(owner=owner, feedback={"mode": "blend"}, repeat_times=8)
    add_member(run, annotator)
    return run


def letters(page: Any) -> list[str]:
    return [str(x) for x in page.locator("#panel .rank-item .rank-letter").all_inner_texts()]


def test_a_ranking_of_eight_by_keyboard_alone(page: Any, live_url: str, run_of_eight: Run, annotator: User) -> None:
    members = _group(run_of_eight, "g", [0.0] * 8)
    _open(page, live_url, run_of_eight)
    page.keyboard.press("r")
    page.wait_for_selector("#panel form.rank[data-complete='0']")
    assert letters(page) == list("ABCDEFGH")
    expect(page.locator("#panel .rank-item[data-letter=A]")).to_be_focused()
    # The person reads A (the worst), presses 8; B, 3; C (the best), 1; ... Each number is a
    # place, whatever was placed before, and focus moves on to the next unranked completion.
    wanted = {"A": 8, "B": 3, "C": 1, "D": 6, "E": 2, "F": 7, "G": 4}
    for letter, place in wanted.items():
        expect(page.locator(f"#panel .rank-item[data-letter={letter}]")).to_be_focused()
        page.keyboard.press(str(place))
        slot = page.locator(f"#panel .rank-slot[data-place='{place}'] .rank-item")
        expect(slot).to_have_attribute("data-letter", letter)
        if letter == "B":
            # Enter before the end saves nothing and moves nothing: it says what is left.
            page.keyboard.press("Enter")
            expect(page.locator("#panel .rank-status")).to_contain_text("6 left")
            assert not Feedback.objects.filter(kind="ranking").exists()
            assert page.locator("#panel .rank-slot.filled").count() == 2
    # Seven placed: the last one has one place left and goes there by itself.
    expect(page.locator("#panel .rank-slot[data-place='5'] .rank-item")).to_have_attribute("data-letter", "H")
    expect(page.locator("#panel form.rank")).to_have_attribute("data-complete", "1")
    assert letters(page) == list("CEBGHDFA")  # shown in their places, best first
    # A second thought: B is the best. 1 on B swaps it with C, which takes B's place 3.
    expect(page.locator("#panel .rank-item[data-letter=G]")).to_be_focused()  # the last one pressed
    page.keyboard.press("ArrowUp")  # to the one above it: B (place 3)
    expect(page.locator("#panel .rank-item[data-letter=B]")).to_be_focused()
    page.keyboard.press("1")
    expect(page.locator("#panel .rank-slot[data-place='3'] .rank-item")).to_have_attribute("data-letter", "C")
    screenshot(page, "ranking-by-keys-1280")
    page.keyboard.press("Enter")
    page.wait_for_selector("#panel .saved")
    ranking = Feedback.objects.get(kind="ranking", author=annotator)
    by_letter = dict(zip("ABCDEFGH", [m.pk for m in members], strict=True))
    assert ranking.value["order"] == [by_letter[x] for x in "BECGHDFA"]


def test_on_a_phone_taps_rank_best_first_and_the_last_one_places_itself(
        browser: Any, live_url: str, run_of_eight: Run, annotator: User) -> None:
    members = _group(run_of_eight, "g", [0.0] * 4)
    context = browser.new_context(base_url=live_url, viewport={"width": 390, "height": 844}, has_touch=True,
                                  is_mobile=True)
    try:
        page = context.new_page()
        page.set_default_timeout(BROWSER_WAIT_MS)
        _open(page, live_url, run_of_eight)
        page.locator("#queue .item .act-rank").first.tap()
        page.wait_for_selector("#panel form.rank[data-complete='0']")
        expect(page.locator("#panel .rank-help .key-hint")).to_be_hidden()  # no keys on a phone
        for letter in "DBA":
            page.locator(f"#panel .rank-item[data-letter={letter}] .completion").tap()
        expect(page.locator("#panel form.rank")).to_have_attribute("data-complete", "1")
        assert letters(page) == list("DBAC")
        assert page.evaluate("() => document.scrollingElement.scrollWidth - innerWidth") <= 0
        screenshot(page, "ranking-by-taps-390")
        page.locator("#panel .rank-save").tap()
        page.wait_for_selector("#panel .saved")
        assert Feedback.objects.get(kind="ranking").value["order"] == [members[i].pk for i in (3, 1, 0, 2)]
    finally:
        context.close()
