"""The smaller defects of the new user's walk (issue 64 item 10), each in a real browser: blank
key hints on the compare buttons, the "N waiting" badge white on light grey and never moving,
"Compare with" turning every line of the run blue, wide tables past a phone's edge with no
hint, "Waiting for the first event." staying after events came, `eval/best_version` listed
under "Constants", the account page's warning linking to itself, the runs list's bare
"40 / 39 of 40"."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import expect

from apps.buffer.services import experience_write
from apps.runs.events import event_publish
from apps.runs.metrics import metric_record
from apps.runs.models import Run
from apps.runs.services import run_transition
from tests.dashboard.test_pages_live import in_a_thread
from tests.factories import add_member, experience_row, make_run, make_taskset
from tests.servers import BROWSER_WAIT_MS, login

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

# The contrast of an element's text against what shows behind it (WCAG's ratio).
CONTRAST = """(el) => {
  const rgba = (s) => { const m = s.match(/[\\d.]+/g).map(Number); return [m[0], m[1], m[2], m.length > 3 ? m[3] : 1]; };
  const lum = (c) => { const l = c.map((v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); });
                       return 0.2126 * l[0] + 0.7152 * l[1] + 0.0722 * l[2]; };
  let bg = [255, 255, 255];
  for (let a = el; a; a = a.parentElement) { const c = rgba(getComputedStyle(a).backgroundColor); if (c[3] >= 1) { bg = c.slice(0, 3); break; } }
  const fg = rgba(getComputedStyle(el).color).slice(0, 3);
  const [x, y] = [lum(fg), lum(bg)];
  return (Math.max(x, y) + 0.05) / (Math.min(x, y) + 0.05);
}"""


def _pending(run: Run, group: str, n: int, *, announce: bool = False) -> list[int]:
    rows = [experience_row(run, key=f"{group}-{i}", group=group, status="pending", reward=None, auto_reward=0.5,
                           response_text=f"Answer {group}-{i}") for i in range(n)]
    return list(experience_write(experiences=rows, announce=announce).ids)


def _running(owner: User, annotator: User, **config: Any) -> Run:
    run = make_run(owner=owner, taskset=make_taskset(owner=owner), feedback={"mode": "blend", "overlap": 1}, **config)
    add_member(run, annotator)
    run_transition(run=run, action="start", actor=owner)
    run.refresh_from_db()
    return run


def test_the_compare_buttons_show_their_keys(page: Any, live_url: str, owner: User, annotator: User) -> None:
    run = _running(owner, annotator)
    _pending(run, "g", 2)
    path = f"/runs/{run.pk}/annotate/"
    login(page, live_url, "annotator", next_path=path)
    page.wait_for_url(f"**{path}")
    page.wait_for_selector("#annotate[data-live=open]")
    page.keyboard.press("c")
    keys = page.locator("#panel form.compare button kbd")
    expect(keys).to_have_count(3)
    for i in range(3):
        assert keys.nth(i).is_visible()
        assert keys.nth(i).evaluate(CONTRAST) >= 3, keys.nth(i).inner_text()


def test_the_waiting_badge_reads_and_follows_the_loop(page: Any, live_url: str, owner: User, annotator: User) -> None:
    run = _running(owner, annotator)
    _pending(run, "a", 2)
    login(page, live_url, "annotator", next_path=f"/runs/{run.pk}/")
    page.wait_for_url(f"**/runs/{run.pk}/")
    badge = page.locator("a.annotate-link #annotate-waiting")
    expect(badge).to_have_text("2 waiting")
    assert badge.evaluate(CONTRAST) >= 4.5
    page.wait_for_selector("#live[data-state=live]")
    in_a_thread(lambda: _pending(run, "b", 3, announce=True))  # new rollouts: the badge moves without a reload
    expect(badge).to_have_text("5 waiting", timeout=BROWSER_WAIT_MS)


def test_compare_with_keeps_each_metrics_colour_and_dashes_the_other_run(page: Any, live_url: str, owner: User,
                                                                          annotator: User) -> None:
    run = make_run(owner=owner, name="this run")
    other = make_run(owner=owner, name="that run")
    for r in (run, other):
        for step in (1, 2, 3):
            metric_record(run=r, step=step, values={"reward/mean": 0.1 * step, "reward/std": 0.05 * step})
    login(page, live_url, "owner", next_path=f"/runs/{run.pk}/")
    page.wait_for_url(f"**/runs/{run.pk}/")
    legend = page.locator("#chart-reward .u-legend .u-series")
    expect(legend).to_have_count(3)  # the x axis and two metrics

    def markers() -> list[tuple[str, str, str]]:
        return page.evaluate("""() => Array.from(document.querySelectorAll('#chart-reward .u-legend .u-series')).slice(1)
            .map((s) => { const m = s.querySelector('.u-marker'); const st = getComputedStyle(m);
                          return [s.querySelector('.u-label').textContent, st.borderTopColor, st.borderTopStyle]; })""")

    before = markers()
    assert before[0][1] != before[1][1]  # two metrics, two colours
    page.select_option("#chart-compare", str(other.pk))
    expect(legend).to_have_count(5)
    after = markers()
    # This run's lines keep their colours and their plain names; the other run's are the same
    # colours, dashed, named with the run.
    assert after[:2] == before
    assert [(label, colour) for label, colour, _ in after[2:]] == [(f"{b[0]} (that run #{other.pk})", b[1]) for b in before]
    assert {style for _, _, style in after[2:]} == {"dashed"}, after


@pytest.mark.parametrize("path", ["/runs/", "summary"])
def test_a_table_past_a_phones_edge_says_it_scrolls(page: Any, live_url: str, owner: User, annotator: User,
                                                     path: str) -> None:
    # Names as the demo's: long, with nothing to break them at.
    run = _running(owner, annotator, name="arithmetic-demo-people-teach-the-working-first")
    _pending(run, "a", 3)
    for step in (1, 2):
        metric_record(run=run, step=step, values={"explore/reward_mean": 0.3 * step, "eval/accuracy": 0.2 * step,
                                                   "eval/preference/shows_the_working_before_the_answer": 0.1 * step})
    if path == "summary":
        run_transition(run=run, action="stop", actor=owner)
        path = f"/runs/{run.pk}/"
    page.set_viewport_size({"width": 320, "height": 640})  # the narrowest phone in use
    login(page, live_url, "annotator" if path == "/runs/" else "owner", next_path=path)
    page.wait_for_url(f"**{path}")
    page.wait_for_load_state("load")
    boxes = page.evaluate("""() => Array.from(document.querySelectorAll('.scroll-x')).filter((b) => b.offsetParent)
        .map((b) => ({wide: b.scrollWidth > b.clientWidth + 1, marked: b.hasAttribute('data-overflows'),
                      hint: getComputedStyle(b, '::before').content, table: b.innerText.slice(0, 40)}))""")
    # Every table wider than its box says it scrolls, and no other does; nothing else is past the edge.
    assert all(b["marked"] and "Scroll sideways" in b["hint"] for b in boxes if b["wide"]), boxes
    assert all(not b["marked"] for b in boxes if not b["wide"]), boxes
    assert page.evaluate("() => document.documentElement.scrollWidth") <= 320
    # A table that does not fit (as the walk's did, on data of its own), swapped in as htmx does: marked.
    page.evaluate("""() => { const box = document.createElement('div'); box.className = 'scroll-x'; box.id = 'wide-box';
        box.innerHTML = '<table class="table"><tr><td>six columns wide</td></tr></table>';
        box.firstElementChild.style.minWidth = '900px';  // through the CSSOM: the pages' CSP refuses inline styles
        document.querySelector('main').appendChild(box);
        document.body.dispatchEvent(new CustomEvent('htmx:afterSettle', {bubbles: true})); }""")
    expect(page.locator("#wide-box")).to_have_attribute("data-overflows", "")
    assert "Scroll sideways" in page.evaluate("() => getComputedStyle(document.getElementById('wide-box'), '::before').content")


def test_the_live_line_leaves_its_first_words_once_an_event_comes(page: Any, live_url: str, owner: User,
                                                                   annotator: User) -> None:
    run = _running(owner, annotator)
    login(page, live_url, "owner", next_path="/runs/")
    page.wait_for_url("**/runs/")
    for path, ready in ((f"/runs/{run.pk}/", "#live[data-state=live]"), (f"/runs/{run.pk}/annotate/", "#annotate[data-live=open]")):
        page.goto(path)
        page.wait_for_selector(ready)
        line = page.locator("#live-line")
        expect(line).to_have_text("Waiting for the first event.")
        in_a_thread(lambda: event_publish(run_id=run.pk, type="buffer.counts", payload={"counts": {}}))
        expect(line).not_to_have_text("Waiting for the first event.", timeout=BROWSER_WAIT_MS)
        expect(line).to_contain_text("buffer counts")


def test_the_best_version_is_no_constant(page: Any, live_url: str, owner: User) -> None:
    run = make_run(owner=owner)
    metric_record(run=run, step=1, values={"learning_rate": 0.001, "eval/best_version": 0.0})
    metric_record(run=run, step=2, values={"learning_rate": 0.001})
    login(page, live_url, "owner", next_path=f"/runs/{run.pk}/")
    page.wait_for_url(f"**/runs/{run.pk}/")
    expect(page.locator("#constants-settings tr[data-metric='learning_rate']")).to_have_count(1)
    expect(page.locator("#constants-settings tr[data-metric='eval/best_version']")).to_have_count(0)
    expect(page.locator("#constants-eval tr[data-metric='eval/best_version']")).to_contain_text("0")
    expect(page.locator("#constants h3").first).to_have_text("Constants")
    expect(page.locator("#constants h3").nth(1)).to_have_text("Latest evaluation")


def test_the_account_pages_warning_points_at_the_field_and_the_runs_list_says_its_steps(
        page: Any, live_url: str, owner: User) -> None:
    run = make_run(owner=owner, name="walked", total_steps=40)
    Run.objects.filter(pk=run.pk).update(explore_step=40, train_step=39)
    User.objects.filter(pk=owner.pk).update(email="")
    login(page, live_url, "owner", next_path="/account/")
    page.wait_for_url("**/account/")
    link = page.locator("#email-warning a")
    expect(link).to_have_attribute("href", "#id_email")
    link.click()
    expect(page.locator("#id_email")).to_be_in_viewport()
    page.goto("/runs/")
    expect(page.locator(f"tr[data-run='{run.pk}'] td.steps")).to_have_text("explored 40 · trained 39 of 40")
