"""Issue 45 on a phone (390 px, touch) and a laptop (1280 px): table headers wrap between words
only (item 3); the annotation page's controls are touch targets of at least 44 px, and its
keyboard hints show only where there is a keyboard (item 6). Measured in Debian's chromium."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import expect

from apps.feedback.review.selectors import REVIEW_PAGE_SIZE
from apps.feedback.kinds.rating import feedback_rate
from bench.common import CHROMIUM, CHROMIUM_ARGS
from apps.runs.models import Run, RunMember
from apps.runs.services import run_transition
from tests.factories import add_member, make_experiences, make_run, make_taskset, make_user
from tests.feedback.test_review_paging_search import NEEDLE, labelled_run
from tests.servers import BROWSER_WAIT_MS

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

PASSWORD = "pw-for-tests-only"
PHONE = {"width": 390, "height": 844}
LAPTOP = {"width": 1280, "height": 720}
TOUCH = 44  # px: the smallest target a finger hits reliably (WCAG 2.5.5)

# Each word (between spaces, hyphens or slashes, where a line may break) of a cell that the
# browser drew on more than one line ("Rewar" / "d").
BROKEN_WORDS = """sel => {
  const broken = [];
  for (const cell of document.querySelectorAll(sel)) {
    const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      for (const m of node.data.matchAll(/[^\\s\\-\\/]+/g)) {
        const range = document.createRange();
        range.setStart(node, m.index);
        range.setEnd(node, m.index + m[0].length);
        const tops = new Set([...range.getClientRects()].filter(r => r.width > 0).map(r => Math.round(r.top)));
        if (tops.size > 1) broken.push(m[0]);
      }
    }
  }
  return broken;
}"""

# The elements a finger taps, each with its drawn size (visible ones only).
SMALL_TARGETS = """([sel, min]) => [...document.querySelectorAll(sel)]
  .filter(e => e.getClientRects().length && getComputedStyle(e).visibility !== 'hidden')
  .map(e => { const r = e.getBoundingClientRect(); return [e.tagName + '.' + e.className + ' ' + e.textContent.trim().slice(0, 20), Math.round(r.width), Math.round(r.height)]; })
  .filter(([, w, h]) => w < min || h < min)"""

TAPPED = ("form.rate label, form.rate button, #queue .item .actions a, #queue .item .actions button, "
          "#panel button, #panel a, #panel label:has(input)")


def a_run_to_label() -> tuple[User, User, Run]:
    owner, annotator = make_user("owner", staff=True), make_user("annotator")
    run = make_run(owner=owner, taskset=make_taskset(owner=owner), name="phone run")
    add_member(run, annotator)
    add_member(run, make_user("viewer"), role=RunMember.Role.VIEWER)
    run_transition(run=run, action="start", actor=owner)
    exps = make_experiences(run, groups=2, group_size=4, status="pending",
                            prompt_text="Solve step by step and put the final number in answer tags: " * 3,
                            response_text="First we add the two numbers together, then we check the sum twice. " * 4
                            + "<answer>2</answer>")
    feedback_rate(run=run, experience=exps[0], score=4, author=owner)
    return owner, annotator, run


def sign_in(page: Any, user: User) -> None:
    page.goto("/login/")
    page.fill("#id_username", user.username)
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url("**/runs/")


def test_table_headers_and_short_cells_wrap_between_words_only(browser: Any, live_url: str) -> None:
    """Long prompts and completions used to squeeze the short columns until "Reward" and
    "pending" broke mid-word (main's `overflow-wrap: anywhere` reached the cells)."""
    owner, _, run = a_run_to_label()
    for size in (PHONE, LAPTOP):
        context = browser.new_context(base_url=live_url, viewport=size, has_touch=size is PHONE, is_mobile=size is PHONE)
        try:
            page = context.new_page()
            page.set_default_timeout(BROWSER_WAIT_MS)
            sign_in(page, owner)
            r = f"/runs/{run.pk}"
            for path in (f"{r}/experiences/", "/runs/", f"{r}/", f"{r}/summary/", f"{r}/signal/raters/",
                         f"{r}/signal/reward-model/", f"{r}/timeline/", "/runs/workers/", f"{r}/keys/", "/accounts/"):
                response = page.goto(path)
                assert response is not None and response.status == 200, (size, path)
                assert page.evaluate(BROKEN_WORDS, "table th, table.experiences td:not(.text), table .status") == [], (size, path)
                # The table scrolls inside its own box, never the page.
                assert page.evaluate("() => document.scrollingElement.scrollWidth - window.innerWidth") <= 0, (size, path)
        finally:
            context.close()


def test_on_a_phone_every_annotation_control_is_a_44px_target_and_no_key_hint_shows(browser: Any, live_url: str) -> None:
    _, annotator, run = a_run_to_label()
    phone = browser.new_context(base_url=live_url, viewport=PHONE, has_touch=True, is_mobile=True)
    try:
        page = phone.new_page()
        page.set_default_timeout(BROWSER_WAIT_MS)
        sign_in(page, annotator)
        page.goto(f"/runs/{run.pk}/annotate/")
        page.wait_for_selector("#annotate[data-live=open]")
        page.wait_for_selector("#queue .item form.rate")
        assert page.evaluate(SMALL_TARGETS, [TAPPED, TOUCH]) == []
        for action, ready in (("compare", "#panel form.compare"), ("rank", "#panel form.rank"), ("edit", "#panel textarea")):
            page.locator(f"#queue .item .act-{action}").first.tap()
            page.wait_for_selector(ready)
            assert page.evaluate(SMALL_TARGETS, [TAPPED, TOUCH]) == [], action
            # No key to press on a touch screen: no "press 1-5", "j/k", "(z)" or <kbd> anywhere.
            assert page.evaluate("() => [...document.querySelectorAll('kbd, .key-hint')]"
                                 ".filter(e => e.getClientRects().length && !e.closest('dialog')).length") == 0, action
    finally:
        phone.close()


def test_key_hints_need_a_fine_pointer_that_hovers(browser: Any, live_url: str) -> None:
    """A phone whose browser reports hover (some Android ones do) but a coarse pointer has no
    keyboard either: Chromium told so by its blink settings (Playwright emulates touch as
    hover: none). A laptop's narrow window (hover and a fine pointer) shows the hints."""
    _, annotator, run = a_run_to_label()
    context = browser.new_context(base_url=live_url, viewport=PHONE)
    try:
        page = context.new_page()
        page.set_default_timeout(BROWSER_WAIT_MS)
        sign_in(page, annotator)
        page.goto(f"/runs/{run.pk}/annotate/")
        page.wait_for_selector("#queue .item form.rate")
        assert page.locator("#key-hint").is_visible()
    finally:
        context.close()
    # Blink's PointerType coarse = 2, HoverType hover = 2.
    hovering_phone = browser.browser_type.launch(
        executable_path=CHROMIUM, args=[*CHROMIUM_ARGS, "--blink-settings=primaryPointerType=2,primaryHoverType=2"])
    try:
        page = hovering_phone.new_context(base_url=live_url, viewport=PHONE).new_page()
        page.set_default_timeout(BROWSER_WAIT_MS)
        sign_in(page, annotator)
        page.goto(f"/runs/{run.pk}/annotate/")
        page.wait_for_selector("#queue .item form.rate")
        assert page.evaluate("() => matchMedia('(hover: hover) and (pointer: coarse)').matches")
        assert not page.locator("#key-hint").is_visible()
    finally:
        hovering_phone.close()


def test_the_review_page_on_a_phone_is_a_page_of_labels_and_its_links_keep_the_search(browser: Any, live_url: str) -> None:
    """Issue 45 item 4: 114 labels were one page 9,248 px tall at 390 px."""
    owner = make_user("olga", staff=True)
    run, rows = labelled_run(owner)
    phone = browser.new_context(base_url=live_url, viewport=PHONE, has_touch=True, is_mobile=True)
    try:
        page = phone.new_page()
        page.set_default_timeout(BROWSER_WAIT_MS)
        sign_in(page, owner)
        page.goto(f"/runs/{run.pk}/review/")
        expect(page.locator("#labels .review-row")).to_have_count(REVIEW_PAGE_SIZE)
        height = page.evaluate("() => document.scrollingElement.scrollHeight")
        assert height < 9248 * 0.6, height  # a page of labels, not all of them
        page.fill("input[name=q]", NEEDLE)
        page.click(".review-filters button[type=submit]")
        page.wait_for_url(f"**/review/?*q={NEEDLE}*")
        first = page.locator("#labels .review-row").first.get_attribute("id")
        page.locator("#review-pager a.older").tap()
        page.wait_for_url("**/review/?*page=2*")
        expect(page.locator("#labels .review-row").first).not_to_have_id(str(first))
        assert f"q={NEEDLE}" in page.url
        expect(page.locator("#labels-shown")).to_contain_text(f"matching “{NEEDLE}” · page 2 of")
    finally:
        phone.close()
