"""Every page on a phone, a laptop and a wide screen (issue 32 item 2), as each persona:
the owner (staff too, so the accounts page is theirs), an annotator and a viewer open every
page they may open, the annotation page's panels (edit, rank, compare) and the run page's
comparison with another run, at 390x844, 1280x720 and 1920x1080; none of them may scroll the
page sideways (a wide table scrolls inside its own box). Each page is opened once, at the
phone's size, and laid out at the laptop's and the wide screen's by resizing the window (the
stylesheet's media queries and the page's resize handlers apply to the document as it is);
the personas sign in and out in one browser context. What the page's scripts decide from the
window when it loads (the guidelines folded on a phone) is the next test's. Screenshots of every page at every size go
to var/screenshots/responsive/ (ignored; with `make screenshots`) for a reviewer."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import expect

from apps.control.notifications import run_end_notify
from apps.feedback.kinds.rating import feedback_rate
from apps.runs.metrics import metric_record
from apps.runs.models import Run, RunMember
from apps.runs.services import run_transition
from tests.factories import add_member, make_experiences, make_run, make_taskset, make_user
from tests.servers import BROWSER_WAIT_MS, screenshot

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

PASSWORD = "pw-for-tests-only"
SIZES = {"390": {"width": 390, "height": 844}, "1280": {"width": 1280, "height": 720},
         "1920": {"width": 1920, "height": 1080}}
GUIDELINES = ("# How to rate\n\nA **good** answer is correct, shows its working and stays on task. "
              "Rate 5 only when nothing could be better; 1 when it is wrong or off-task.\n\n"
              "- wrong arithmetic: 1\n- right but unexplained: 3\n- right and explained: 5\n")


def a_team() -> tuple[dict[str, User], Run, Run]:
    """A running run with everything a page can show (metrics, a long completion, feedback,
    members of each role) and a second run with data to compare it with."""
    people = {"owner": make_user("owner", staff=True), "annotator": make_user("annotator"),
              "viewer": make_user("viewer")}
    owner = people["owner"]
    run = make_run(owner=owner, taskset=make_taskset(owner=owner), name="a run with a rather long name for a phone",
                   feedback={"mode": "blend", "guidelines": GUIDELINES, "overlap": 3})
    add_member(run, people["annotator"])
    add_member(run, people["viewer"], role=RunMember.Role.VIEWER)
    run_transition(run=run, action="start", actor=owner)
    long_line = "x" * 300  # a completion without spaces must wrap or scroll inside its box
    exps = make_experiences(run, groups=2, group_size=4, status="pending",
                            response_text=f"<answer>2</answer> {long_line}")
    feedback_rate(run=run, experience=exps[0], score=4, author=people["annotator"])
    feedback_rate(run=run, experience=exps[0], score=1, author=owner)  # a disagreement for the review page
    for step in range(1, 6):
        metric_record(run=run, step=step, values={
            "explore/reward_mean": 0.1 * step, "explore/reward_std": 0.05, "loss": 1.0 / step,
            "learning_rate": 1e-5, "a/very/long/metric/name/that/could/widen/a/table/when/it/is/not/wrapped": 1.0})
    other = make_run(owner=owner, taskset=make_taskset(owner=owner, name="other"), name="other")
    metric_record(run=other, step=1, values={"explore/reward_mean": 0.2})
    add_member(other, people["annotator"])
    add_member(other, people["viewer"], role=RunMember.Role.VIEWER)
    # A run that failed with a long reason: everyone's notifications page lists it.
    failed = make_run(owner=owner, name="a run that failed with a rather long name for a phone")
    add_member(failed, people["annotator"])
    add_member(failed, people["viewer"], role=RunMember.Role.VIEWER)
    Run.objects.filter(pk=failed.pk).update(status=Run.Status.RUNNING)
    run_transition(run=failed, action="fail", reason="train step 3 RuntimeError: " + "y" * 300)
    run_end_notify(run_id=failed.pk, audit_id=failed.audit.get(action="fail").pk)
    return people, run, other


def pages_of(run: Run, other: Run | None = None) -> dict[str, str]:
    group = run.experiences.order_by("id").first()
    assert group is not None
    r = f"/runs/{run.pk}"
    return {
        "home": "/", "runs": "/runs/", "run": f"{r}/", "experiences": f"{r}/experiences/",
        "group": f"{r}/groups/{group.group_id}/", "export": f"{r}/export/", "audit": f"{r}/audit/",
        "timeline": f"{r}/timeline/", "failures": f"{r}/failures/", "waiting": f"{r}/waiting/",
        "members": f"{r}/members/", "summary": f"{r}/summary/", "workers": "/runs/workers/",
        "keys": f"/runs/{run.pk}/keys/", "raters": f"{r}/signal/raters/", "reward-model": f"{r}/signal/reward-model/",
        "annotate": f"{r}/annotate/", "new-run": "/runs/new/", "accounts": "/accounts/",
        "config-diff": f"{r}/diff/{(other or run).pk}/", "runs-sorted": "/runs/?sort=-reward&status=running",
        "notifications": "/notifications/",
        "review": f"{r}/review/",  # the owner's review of labels (annotators and viewers: 403)
    }


# What each persona may open (the others answer 403/404 or send them to log in).
MAY_OPEN = {
    "owner": None,  # everything
    "annotator": {"home", "runs", "run", "experiences", "group", "export", "audit", "timeline", "failures",
                  "waiting", "members", "summary", "workers", "annotate", "config-diff", "runs-sorted", "notifications"},
    "viewer": {"home", "runs", "run", "experiences", "group", "export", "audit", "timeline", "failures",
               "waiting", "members", "summary", "workers", "annotate", "config-diff", "runs-sorted", "notifications"},
}


def overflow(page: Any) -> int:
    return int(page.evaluate("() => document.scrollingElement.scrollWidth - window.innerWidth"))


def widest(page: Any) -> str:
    """The elements that stick out of the window, for the failure message."""
    return str(page.evaluate("""() => Array.from(document.querySelectorAll('body *'))
        .filter(e => e.getBoundingClientRect().right > window.innerWidth + 1)
        .slice(0, 6).map(e => e.tagName + '#' + e.id + '.' + e.className + ' ' + Math.round(e.getBoundingClientRect().right))""")
               )


def look(page: Any, name: str, persona: str, problems: list[str]) -> None:
    """The page at each size, narrowest first (the size it was opened at), then back to it."""
    for width, size in SIZES.items():
        if page.viewport_size != size:
            page.set_viewport_size(size)
            # Two frames: the resize handlers (htmx, the charts) have run and their layout is measured.
            page.evaluate("() => new Promise((done) => requestAnimationFrame(() => requestAnimationFrame(done)))")
        screenshot(page, f"responsive/{name}-{persona}-{width}")
        wide = overflow(page)
        if wide > 0:
            problems.append(f"{persona} {name} at {width}: {wide} px wider than the window: {widest(page)}")
    page.set_viewport_size(SIZES["390"])


def sign_in(page: Any, user: User) -> None:
    page.context.clear_cookies()
    page.goto("/login/")
    page.fill("#id_username", user.username)
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url("**/runs/")


def test_no_page_scrolls_sideways_for_anyone_on_a_phone_a_laptop_or_a_wide_screen(browser: Any, live_url: str) -> None:
    people, run, other = a_team()
    context = browser.new_context(base_url=live_url, viewport=SIZES["390"])
    page = context.new_page()
    page.set_default_timeout(BROWSER_WAIT_MS)
    problems: list[str] = []
    try:
        for name, path in (("login", "/login/"), ("password-reset", "/password/reset/")):
            page.goto(path)
            look(page, name, "anonymous", problems)
        for persona, user in people.items():
            sign_in(page, user)
            allowed = MAY_OPEN[persona]
            for name, path in pages_of(run, other).items():
                response = page.goto(path)
                assert response is not None
                if allowed is None or name in allowed:
                    assert response.status == 200, (persona, name, response.status)
                    assert "/login/" not in page.url, (persona, name)
                if name == "run":
                    page.wait_for_selector("#live[data-state=live]")
                    page.wait_for_selector("#chart-reward canvas, .chart canvas")
                look(page, name, persona, problems)
                if name == "annotate" and persona != "viewer":
                    for action, ready in (("edit", "#panel textarea"), ("rank", "#panel form.rank"),
                                          ("compare", "#panel form.compare")):
                        page.locator(f"#queue .item .act-{action}").first.click()
                        page.wait_for_selector(ready)
                        look(page, f"annotate-{action}", persona, problems)
                if name == "run":
                    # The comparison with another run: its curves beside this run's.
                    picker = page.locator("#chart-compare")
                    expect(picker).to_be_visible()
                    picker.select_option(str(other.pk))
                    page.wait_for_function("id => Object.values(window.rftCharts).some(c => c.key.includes(id + ':'))",
                                           arg=str(other.pk))
                    look(page, "compare", persona, problems)
    finally:
        context.close()
    assert not problems, "\n".join(problems)


# --- the annotation page on a phone -------------------------------------------------------------

def test_on_a_phone_the_annotation_page_is_one_column_with_the_guidelines_folded_and_no_key_hints_on_touch(
        browser: Any, live_url: str) -> None:
    people, run, _ = a_team()
    phone = browser.new_context(base_url=live_url, viewport=SIZES["390"], has_touch=True, is_mobile=True)
    laptop = browser.new_context(base_url=live_url, viewport=SIZES["1280"])
    try:
        page = phone.new_page()
        page.set_default_timeout(BROWSER_WAIT_MS)
        assert page.evaluate("() => matchMedia('(hover: none)').matches")
        sign_in(page, people["annotator"])
        # Their runs list shows "Annotate" without scrolling sideways for it.
        expect(page.locator(f"tr[data-run='{run.pk}'] a.annotate-link")).to_be_in_viewport()
        page.goto(f"/runs/{run.pk}/annotate/")
        page.wait_for_selector("#queue .item")
        item = page.locator("#queue .item").first.bounding_box()
        guidelines = page.locator("#guidelines").bounding_box()
        assert item is not None and guidelines is not None
        assert item["width"] >= 330, item  # the whole width, not a third of it
        assert guidelines["y"] < item["y"]  # folded above the queue, not beside it
        assert page.locator("#guidelines").get_attribute("open") is None
        page.click("#guidelines > summary")
        expect(page.locator("#guidelines .md")).to_contain_text("right and explained")
        expect(page.locator("#key-hint")).to_be_hidden()  # a touch screen has no keys to press
        # The thumbs are drawn, not left to an emoji font the phone may lack.
        assert page.locator("form.rate label.thumb-up svg").count() >= 1
        assert "👍" not in page.inner_text("#queue")
        # A panel opened from an item comes into view under the queue (once the page's scripts
        # run: a tap before htmx has wired the link follows its plain href).
        page.wait_for_selector("#annotate[data-live=open]")
        page.locator("#queue .item .act-rank").first.tap()
        page.wait_for_selector("#panel form.rank")
        expect(page.locator("#panel form.rank")).to_be_in_viewport()
        assert overflow(page) <= 0

        wide = laptop.new_page()
        wide.set_default_timeout(BROWSER_WAIT_MS)
        sign_in(wide, people["annotator"])
        wide.goto(f"/runs/{run.pk}/annotate/")
        wide.wait_for_selector("#queue .item")
        expect(wide.locator("#key-hint")).to_be_visible()  # a keyboard: the hints are for it
        assert wide.locator("#guidelines").get_attribute("open") is not None
        # A viewer cannot annotate: no keys to learn.
        sign_in(wide, people["viewer"])
        wide.goto(f"/runs/{run.pk}/annotate/")
        wide.wait_for_selector("#annotate")
        assert wide.locator("#key-hint").count() == 0 and wide.locator("kbd").count() == 0
    finally:
        phone.close()
        laptop.close()
