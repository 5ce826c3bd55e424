"""A run copied through the form (/runs/new/?from=N) keeps its guidelines byte for byte, so the
config diff does not list them (issue 45, item 5: a browser posts a textarea's lines with
\\r\\n); and the diff reads at a phone's and a laptop's width: a key breaks only between its
dotted parts, and nothing scrolls sideways."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import expect

from apps.cli.management.commands.rft_demo import DEMO_GUIDELINES
from apps.runs.models import Run
from apps.runs.selectors import config_differences
from tests.factories import make_run, make_taskset
from tests.servers import BROWSER_WAIT_MS, login_to_runs

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

# Where a key's text wraps onto a new line, the character before the break (markup aside).
KEY_BREAKS = """() => Array.from(document.querySelectorAll('tr[data-path] > :first-child code')).map((code) => {
  const walker = document.createTreeWalker(code, NodeFilter.SHOW_TEXT);
  const chars = [];
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    for (let i = 0; i < node.textContent.length; i++) {
      const range = document.createRange();
      range.setStart(node, i);
      range.setEnd(node, i + 1);
      const rect = range.getBoundingClientRect();
      if (rect.width > 0) chars.push([node.textContent[i], rect.top]);
    }
  }
  const breaks = [];
  for (let i = 1; i < chars.length; i++) if (chars[i][1] > chars[i - 1][1] + 2) breaks.push(chars[i - 1][0] + chars[i][0]);
  return {key: code.textContent, breaks: breaks};
})"""


def test_a_copy_through_the_form_keeps_the_guidelines_and_the_diff_says_the_same(
        page: Any, live_url: str, owner: User) -> None:
    source = make_run(owner=owner, taskset=make_taskset(owner=owner), name="original",
                      feedback={"mode": "blend", "guidelines": DEMO_GUIDELINES})
    assert "\n" in DEMO_GUIDELINES and DEMO_GUIDELINES.endswith("\n")
    login_to_runs(page, owner.username)
    page.goto(f"/runs/new/?from={source.pk}")
    expect(page.locator("#id_name")).to_have_value("original (copy)")
    taskset = page.locator("select[name=taskset_id]")
    if taskset.count():
        taskset.select_option(str(source.taskset_id))
    page.locator("form button[type=submit]", has_text="Create").first.click()
    page.wait_for_url("**/runs/*/")
    copy = Run.objects.get(name="original (copy)")
    assert copy.config["feedback"]["guidelines"] == DEMO_GUIDELINES
    assert config_differences(copy.config, source.config) == []
    page.goto(f"/runs/{copy.pk}/diff/{source.pk}/")
    expect(page.locator("#diff-same")).to_be_visible()
    assert page.locator('tr[data-path="feedback.guidelines"]').count() == 0


def test_the_diff_ignores_line_endings_of_copies_saved_before(owner: User) -> None:
    source = make_run(owner=owner, name="original", feedback={"guidelines": DEMO_GUIDELINES})
    # What the form stored before: \r\n line endings, the last newline stripped.
    old = make_run(owner=owner, name="old copy", feedback={"guidelines": DEMO_GUIDELINES})
    Run.objects.filter(pk=old.pk).update(config={**old.config, "feedback": {
        **old.config["feedback"], "guidelines": DEMO_GUIDELINES.strip().replace("\n", "\r\n")}})
    old.refresh_from_db()
    assert config_differences(old.config, source.config) == []
    changed = {**old.config, "feedback": {**old.config["feedback"], "guidelines": "Rate kindly.\r\n"}}
    assert [d["path"] for d in config_differences(changed, source.config)] == ["feedback.guidelines"]


@pytest.mark.parametrize("width", [390, 1280])
def test_the_diff_reads_at_both_widths(browser: Any, live_url: str, owner: User, width: int) -> None:
    left = make_run(owner=owner, name="a run with a rather long name to show", repeat_times=6,
                    sampling={"temperature": 0.7, "max_tokens": 99},
                    feedback={"mode": "blend", "w_human": 0.8, "hold_cap_seconds": 120.0, "guidelines": DEMO_GUIDELINES,
                              "selection": {"random_share": 0.25, "pairs": False}})
    right = make_run(owner=owner, name="its sibling", feedback={"mode": "blend", "guidelines": "Short."})
    context = browser.new_context(base_url=live_url, viewport={"width": width, "height": 800})
    page = context.new_page()
    page.set_default_timeout(BROWSER_WAIT_MS)
    try:
        login_to_runs(page, owner.username)
        page.goto(f"/runs/{left.pk}/diff/{right.pk}/")
        expect(page.locator('tr[data-path="feedback.selection.random_share"]')).to_be_visible()
        keys = page.evaluate(KEY_BREAKS)
        assert len(keys) == len(config_differences(left.config, right.config)) >= 6
        # A key breaks only after a dot (between its parts), never inside one.
        inside = [k for k in keys if any(not pair.startswith(".") for pair in k["breaks"])]
        assert not inside, f"keys broken inside a part at {width} px: {inside}"
        if width >= 1000:
            assert all(not k["breaks"] for k in keys), keys  # one line each on a laptop
        # Nothing scrolls sideways: not the page, not the table in its box.
        assert page.evaluate("() => document.documentElement.scrollWidth") <= width
        box = page.locator(".config-diff").locator("xpath=..")
        assert box.evaluate("(el) => el.scrollWidth <= el.clientWidth + 1"), "the diff table scrolls sideways"
        # Each value says whose it is on a phone, where the header row is out of sight.
        row = page.locator('tr[data-path="feedback.guidelines"]')
        expect(row).to_contain_text("Short.")
        if width < 700:
            assert row.locator("td.left").evaluate("(td) => getComputedStyle(td, '::before').content").strip('"') \
                == f"{left.name} #{left.pk}"
    finally:
        context.close()
