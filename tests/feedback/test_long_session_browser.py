"""A long labelling session on the annotation page (issue 45, item 3), at a phone's and a
laptop's width: finished cards are put away beyond the last few (counted, with a link to
the person's submissions), so the page's height stays bounded however many items someone
labels, and the finished cards that stay read at AA contrast."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import expect

from apps.buffer.services import experience_write
from apps.feedback.models import Assignment, Feedback
from apps.runs.models import Run
from tests.factories import add_member, experience_row, make_run
from tests.servers import login

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

# WCAG 2 contrast of every text-bearing element of the finished cards' headers, against what
# is behind it: colours composited over the nearest opaque background, and the opacity of the
# ancestors applied to both (an element at opacity .6 shows the page through its text).
CONTRASTS = """() => {
  const rgba = (s) => { const m = s.match(/[\\d.]+/g).map(Number); return [m[0], m[1], m[2], m.length > 3 ? m[3] : 1]; };
  const over = (top, under) => top.slice(0, 3).map((c, i) => c * top[3] + under[i] * (1 - top[3]));
  const lum = (c) => { const l = c.map((v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); });
                       return 0.2126 * l[0] + 0.7152 * l[1] + 0.0722 * l[2]; };
  const page = [255, 255, 255];
  const out = [];
  for (const el of document.querySelectorAll("#queue .item.done header, #queue .item.done header *")) {
    if (!Array.from(el.childNodes).some((n) => n.nodeType === 3 && n.textContent.trim())) continue;
    let bg = null, opacity = 1;
    for (let a = el; a; a = a.parentElement) {
      const st = getComputedStyle(a);
      opacity *= Number(st.opacity);
      const c = rgba(st.backgroundColor);
      if (!bg && c[3] > 0) bg = c[3] >= 1 ? c.slice(0, 3) : null;
    }
    bg = bg || page;
    const fg = over(rgba(getComputedStyle(el).color), bg);
    const shownFg = over([...fg, opacity], page), shownBg = over([...bg, opacity], page);
    const [a, b] = [lum(shownFg), lum(shownBg)];
    out.push({text: el.textContent.trim().slice(0, 40), ratio: (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05)});
  }
  return out;
}"""

KEEP_DONE = 8  # the finished cards the queue keeps in view (static/feedback/annotate.js): a queue's worth
# The vertical space of an element in the queue: its box and its margins.
_SPACE = """const space = (el) => { const st = getComputedStyle(el);
  return el.getBoundingClientRect().height + parseFloat(st.marginTop) + parseFloat(st.marginBottom); };"""
# The queue's height less its open items: its finished cards, the note that counts the ones
# put away, its controls.
QUEUE_WITHOUT_OPEN = f"""() => {{ {_SPACE}
  const open = Array.from(document.querySelectorAll("#queue .item:not(.done)"));
  return document.getElementById("queue").getBoundingClientRect().height - open.map(space).reduce((a, b) => a + b, 0); }}"""
DONE_SPACES = f"""() => {{ {_SPACE} return Array.from(document.querySelectorAll("#queue .item.done")).map(space); }}"""
NOTE_SPACE = f"""() => {{ {_SPACE} const note = document.getElementById("done-note"); return note ? space(note) : 0; }}"""


def _run(owner: User, annotator: User, items: int) -> Run:
    run = make_run(owner=owner, feedback={"mode": "blend", "overlap": 1})
    add_member(run, annotator)
    rows = [experience_row(run, key=f"g{i // 4}-{i % 4}", group=f"g{i // 4}", status="pending", reward=None,
                           auto_reward=0.5, response_text=f"Answer {i}: 2 + 2 = 4, so <answer>4</answer>")
            for i in range(items)]
    experience_write(experiences=rows)
    return run


def _labelled(page: Any) -> int:
    """Items finished on the page: the cards still shown plus those put away."""
    return int(page.evaluate("""() => document.querySelectorAll('#queue .item.done').length +
                                     Number((document.getElementById('done-away') || {}).textContent || 0)"""))


@pytest.mark.parametrize("width", [390, 1280])
def test_the_page_stays_bounded_however_many_items_are_labelled(browser: Any, live_url: str, owner: User,
                                                                annotator: User, width: int) -> None:
    labels = 28
    run = _run(owner, annotator, items=labels + 4)
    context = browser.new_context(base_url=live_url, viewport={"width": width, "height": 800})
    page = context.new_page()
    page.set_default_timeout(20_000)
    try:
        path = f"/runs/{run.pk}/annotate/"
        login(page, live_url, "annotator", next_path=path)
        page.wait_for_url(f"**{path}")
        page.wait_for_selector("#annotate[data-live=open]")
        start = page.evaluate(QUEUE_WITHOUT_OPEN)
        heights = []  # after each label: the queue's height less its open items
        for n in range(1, labels + 1):
            if page.locator("#queue .item:not(.done)").count() == 0:
                page.click("#load-more")  # (the page tops itself up; the old one needed this)
            expect(page.locator("#queue .item.current")).to_have_count(1)
            page.keyboard.press("4")
            page.keyboard.press("Enter")
            page.wait_for_function(f"() => ({_labelled_js()}) >= {n}")
            heights.append(page.evaluate(QUEUE_WITHOUT_OPEN))
        assert Feedback.objects.filter(run=run, author=annotator, kind="rating").count() == labels
        # The queue's height does not grow with the labels, at either width: beyond its first
        # (open items and its controls), the finished cards it keeps, one more (a card is marked
        # done a moment before the oldest is put away) and the note that counts the rest. The
        # open items are taken out: the queue tops itself up in whole groups, so how many are
        # open at a label depends on timing (a fixed allowance over the first page's height
        # failed by 23 px when two more were open). The old page: a finished card more a label.
        card = max(page.evaluate(DONE_SPACES))
        bound = start + (KEEP_DONE + 1) * card + page.evaluate(NOTE_SPACE)
        assert max(heights) <= bound, f"the queue less its open items, {round(start)} px at first: {[round(h) for h in heights]}"
        assert _labelled(page) == labels
        # At most a queue's worth of finished cards stay; the rest are counted, with a link.
        assert page.locator("#queue .item.done").count() <= KEEP_DONE
        note = page.locator("#done-note")
        expect(note).to_be_visible()
        assert int(page.inner_text("#done-away")) == labels - page.locator("#queue .item.done").count()
        assert note.locator("a").get_attribute("href") == f"/runs/{run.pk}/annotate/mine/"
        # What waits is in the queue: the page topped itself up to the items still open.
        left = Assignment.objects.filter(run=run, annotator=annotator, status="leased").count()
        expect(page.locator("#queue .item:not(.done)")).to_have_count(left)

        ratios = page.evaluate(CONTRASTS)
        assert ratios, "no finished card headers to measure"
        low = [r for r in ratios if r["ratio"] < 4.5]
        assert not low, f"finished cards' headers under AA contrast: {low}"

        # A label whose card was put away, withdrawn from the submissions box: its item comes
        # back to the queue, open (there was no card for the reopened one to replace).
        expect(page.locator("#mine li.submission")).to_have_count(10)
        away = [f for f in Feedback.objects.filter(run=run, author=annotator).order_by("-id")[:10]
                if page.locator(f'#queue .item[data-experience="{f.experience_id}"]').count() == 0]
        assert away, "every label in the box still has its card"
        page.locator(f'#mine li.submission[data-feedback="{away[0].pk}"]').get_by_role("button", name="Withdraw").click()
        expect(page.locator(f'#queue .item:not(.done)[data-experience="{away[0].experience_id}"]')).to_have_count(1)
        assert not Feedback.objects.filter(pk=away[0].pk).exists()
    finally:
        context.close()


def _labelled_js() -> str:
    return ("document.querySelectorAll('#queue .item.done').length + "
            "Number((document.getElementById('done-away') || {}).textContent || 0)")
