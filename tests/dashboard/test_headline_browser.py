"""The run page's headline in Chromium at a phone's width and a laptop's (issue 64): it leads
the page, above the charts; its figures read as tests/dashboard/headline_rows.py recomputes
them; the answers stand side by side at 1280 px and stacked at 390 px, model output as text;
nothing scrolls the page sideways; picking another metric in the versions panel names the best
by it without a reload; and an evaluation landing while the page is open moves the headline
and the panel live."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import expect

from apps.runs.models import ModelVersion
from apps.runs.services import eval_result_record
from tests.dashboard.headline_rows import ACCURACY, TASKS, WORKING, interval, taught_run
from tests.dashboard.test_pages_live import in_a_thread
from tests.servers import BROWSER_WAIT_MS, login_to_runs, screenshot

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def _box(page: Any, selector: str) -> dict[str, float]:
    box = page.locator(selector).bounding_box()
    assert box is not None, selector
    return dict(box)


def test_the_headline_at_a_phone_and_a_laptop_width(page: Any, live_url: str, owner: User, annotator: User) -> None:
    taught = taught_run(owner, annotator)
    login_to_runs(page, owner.username)
    for width, height in ((390, 844), (1280, 720)):
        page.set_viewport_size({"width": width, "height": height})
        page.goto(f"/runs/{taught.run.pk}/")
        head = page.locator("#headline")
        expect(head).to_be_visible(timeout=BROWSER_WAIT_MS)
        # It leads: above the charts, in the first screenful's reach.
        assert _box(page, "#headline")["y"] < _box(page, "#charts")["y"]
        low, high = interval(WORKING[3], TASKS[3])
        expect(head.locator('[data-figure="now"]')).to_have_text(f"{WORKING[3]:.3f}")
        expect(head.locator('[data-figure="now-interval"]')).to_have_text(f"[{low:.3f}, {high:.3f}]")
        expect(head.locator("#headline-blind")).to_contain_text("too few votes to tell")
        # Model output is text: the hostile answer ran no script and made no bold.
        assert page.evaluate("() => window.pwned === undefined")
        expect(head.locator(".answer-text b")).to_have_count(0)
        expect(head.locator(".answer-pair")).to_have_count(3)
        start, newest = _box(page, '.answer-pair >> nth=0 >> [data-side="start"]'), _box(
            page, '.answer-pair >> nth=0 >> [data-side="newest"]')
        if width == 390:  # stacked: the newest below version 0's
            assert newest["y"] >= start["y"] + start["height"] - 1
        else:  # side by side
            assert abs(newest["y"] - start["y"]) < 2 and newest["x"] > start["x"] + start["width"] - 1
        # The three figures side by side on a laptop, one under another on a phone.
        share, twin = _box(page, "#headline-share"), _box(page, "#headline-twin")
        assert (twin["y"] >= share["y"] + share["height"] - 1) if width == 390 else abs(twin["y"] - share["y"]) < 2
        assert page.evaluate("() => document.scrollingElement.scrollWidth - window.innerWidth") <= 0, width
        screenshot(page, f"headline-{width}")
    # The owner picks accuracy: the panel names the best by it, without a reload.
    page.evaluate("() => { window.notReloaded = true; }")
    page.select_option("#versions-best-by", "eval/accuracy")
    best = max(range(4), key=lambda v: (ACCURACY[v], -v))
    expect(page.locator("#versions-best")).to_contain_text(f"best by accuracy (the domain's verifier): v{best}",
                                                           timeout=BROWSER_WAIT_MS)
    assert page.evaluate("() => window.notReloaded === true")

    # Version 4 is published and evaluated while the page is open, as a worker would: the
    # headline's "now" and the panel (still by the metric picked) follow without a reload.
    ModelVersion.objects.create(run=taught.run, number=4, checkpoint="/nowhere/v4", train_step=8)
    in_a_thread(lambda: eval_result_record(run=taught.run, version=4, step=8, values={
        "eval/preference/working": 0.7, "eval/accuracy": 0.9, "eval/tasks": 64.0, "eval/version": 4.0}))
    low, high = interval(0.7, 64)
    expect(page.locator('#headline [data-figure="now"]')).to_have_text("0.700", timeout=BROWSER_WAIT_MS)
    expect(page.locator('#headline [data-figure="now-interval"]')).to_have_text(f"[{low:.3f}, {high:.3f}]")
    expect(page.locator("#versions-best")).to_contain_text("best by accuracy (the domain's verifier): v4",
                                                           timeout=BROWSER_WAIT_MS)
    assert page.evaluate("() => window.notReloaded === true")
