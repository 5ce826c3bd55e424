"""The run page's charts, round two (issue 32), read from what uPlot draws in a real browser:
"Compare with" is a picker of the runs that have data, a run's mean and std are two shades,
a section's single chart spans the row, the weight-sync axes leave room between their labels
(on a phone and a laptop), and feedback per minute drops to zero over empty minutes instead
of drawing a line across them. Plus the runs an owner is not invited to annotate."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from apps.feedback.models import Feedback
from apps.feedback.kinds.rating import feedback_rate
from apps.runs.metrics import metric_record
from apps.runs.models import ModelVersion, Run, WeightLoad
from apps.runs.services import run_transition
from tests.dashboard.test_charts import plot
from tests.factories import make_experiences, make_run, make_taskset, make_user
from tests.servers import BROWSER_WAIT_MS, login_to_runs, screenshot

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

PHONE = {"width": 390, "height": 844}
LAPTOP = {"width": 1280, "height": 720}


@pytest.fixture
def owner() -> User:
    return make_user("owner")


def running(owner: User, name: str = "demo", **config: Any) -> Run:
    run = make_run(owner=owner, taskset=make_taskset(owner=owner), name=name, **config)
    run_transition(run=run, action="start", actor=owner)
    return run


def opened(browser: Any, live_url: str, owner: User, run: Run, size: dict[str, int] = LAPTOP) -> Any:
    context = browser.new_context(base_url=live_url, viewport=size)
    page = context.new_page()
    page.set_default_timeout(BROWSER_WAIT_MS)
    login_to_runs(page, owner.username)
    page.goto(f"/runs/{run.pk}/")
    page.wait_for_selector("#live[data-state=live]")
    return page


def test_compare_with_offers_the_runs_with_data_and_a_runs_mean_and_std_are_two_shades(
        browser: Any, live_url: str, owner: User) -> None:
    a = running(owner)
    baseline = make_run(owner=owner, taskset=make_taskset(owner=owner), name="baseline")
    broken = running(owner, name="broken")
    run_transition(run=broken, action="fail", reason="no model")  # failed before any step: nothing to draw
    for step in (1, 2, 3):
        for run, scale in ((a, 0.2), (baseline, 0.1)):
            metric_record(run=run, step=step, values={"reward/mean": scale * step, "reward/std": 0.05})
    page = opened(browser, live_url, owner, a)
    try:
        page.wait_for_selector("#chart-reward canvas")
        offered = page.locator("#chart-compare option").evaluate_all("os => os.filter(o => o.value).map(o => o.value)")
        assert offered == [str(baseline.pk)]  # not the failed run without data
        assert page.get_attribute("#chart-compare", "multiple") is None  # a picker, not a raw multi-select
        # Alone: mean and std in two colours.
        alone = plot(page, "reward", "u.series.slice(1).map(s => s._stroke || s.stroke)")
        assert len(set(alone)) == 2
        page.select_option("#chart-compare", str(baseline.pk))
        page.wait_for_selector("#chart-reward[data-series='4']")
        page.wait_for_selector(f"#chart-compared .chip[data-run='{baseline.pk}']")
        labels = plot(page, "reward", "u.series.slice(1).map(s => s.label)")
        strokes = dict(zip(labels, plot(page, "reward", "u.series.slice(1).map(s => String(s._stroke || s.stroke))"),
                           strict=True))
        # Each metric keeps its colour (every line of this run turned one blue: issue 64 item 10);
        # the compared run's lines are the same colours, dashed.
        assert strokes["reward/mean"] != strokes["reward/std"], strokes
        assert [strokes["reward/mean"], strokes["reward/std"]] == [str(c) for c in alone]
        assert strokes[f"reward/mean (baseline #{baseline.pk})"] == strokes["reward/mean"]
        assert strokes[f"reward/std (baseline #{baseline.pk})"] == strokes["reward/std"]
        dashed = plot(page, "reward", "u.series.slice(1).map(s => !!s.dash)")
        assert dashed == [False, False, True, True]
        screenshot(page, "dashboard-compare-shades")
        page.click(f"#chart-compared .chip[data-run='{baseline.pk}']")
        page.wait_for_selector("#chart-reward[data-series='2']")
    finally:
        page.context.close()


def test_a_sections_single_chart_spans_the_row(browser: Any, live_url: str, owner: User) -> None:
    run = running(owner)
    metric_record(run=run, step=1, values={"loss": 1.0})
    metric_record(run=run, step=2, values={"loss": 0.5})
    page = opened(browser, live_url, owner, run)
    try:
        page.wait_for_selector("#section-loss .chart canvas, .chart-section .chart canvas")
        widths = page.evaluate("""() => Array.from(document.querySelectorAll('.chart-section')).map(s => {
            const charts = s.querySelectorAll('.chart');
            return [s.id, charts.length, charts[0].getBoundingClientRect().width, s.querySelector('.chart-grid').clientWidth,
                    charts[0].querySelector('canvas').getBoundingClientRect().width];
        })""")
        singles = [w for w in widths if w[1] == 1]
        assert singles, widths
        for section, _, chart, row, canvas in singles:
            assert chart >= 0.98 * row, (section, chart, row)  # the whole row, not a third of it
            assert canvas >= 0.9 * chart, (section, canvas, chart)  # and the plot fills its card
    finally:
        page.context.close()


def test_feedback_per_minute_is_zero_over_minutes_without_feedback(browser: Any, live_url: str, owner: User) -> None:
    run = running(owner, feedback={"mode": "blend"})
    exps = make_experiences(run, groups=1, group_size=3, status="pending")
    for e in exps:
        feedback_rate(run=run, experience=e, score=4, author=owner)
    now = timezone.now().replace(second=30, microsecond=0)
    first, second, third = Feedback.objects.filter(run=run).order_by("id")
    Feedback.objects.filter(pk__in=[first.pk, second.pk]).update(created_at=now - timedelta(minutes=5))
    Feedback.objects.filter(pk=third.pk).update(created_at=now)
    page = opened(browser, live_url, owner, run)
    try:
        page.wait_for_selector("#chart-feedback canvas")
        xs = plot(page, "feedback", "u.data[0]")
        counts = plot(page, "feedback", "u.data[1]")
        assert [b - a for a, b in zip(xs, xs[1:], strict=False)] == [60] * 5  # every minute between
        assert counts == [2, 0, 0, 0, 0, 1]
    finally:
        page.context.close()


def test_a_twins_page_draws_no_feedback_chart(browser: Any, live_url: str, owner: User) -> None:
    """A twin takes no labels by construction: its page drew an always-empty "Feedback per
    minute" chart beside the others. Its run (people's) still draws one."""
    people = running(owner, name="people", feedback={"mode": "blend"})
    twin = running(owner, name="twin")
    Run.objects.filter(pk=twin.pk).update(twin_of=people)
    for run, drawn in ((people, 1), (twin, 0)):
        page = opened(browser, live_url, owner, run)
        try:
            page.wait_for_selector("#chart-buffer canvas")  # the page's charts are drawn by now
            assert page.locator("#chart-feedback").count() == drawn, run.name
        finally:
            page.context.close()


@pytest.mark.parametrize(("size", "every"), [(PHONE, 5), (LAPTOP, 5), (PHONE, 240), (LAPTOP, 240)],
                         ids=["390-seconds", "1280-seconds", "390-minutes", "1280-minutes"])
def test_the_weight_sync_axes_leave_room_between_their_labels(browser: Any, live_url: str, owner: User,
                                                            size: dict[str, int], every: int) -> None:
    """A version every 5 s (a small demo run: tick labels with seconds) or every 4 minutes."""
    run = running(owner)
    start = timezone.now() - timedelta(seconds=13 * every)
    for number in range(1, 13):
        version = ModelVersion.objects.create(run=run, number=number, checkpoint=f"/ckpt/v{number}", train_step=number)
        at = start + timedelta(seconds=every * number)
        ModelVersion.objects.filter(pk=version.pk).update(created_at=at)
        load = WeightLoad.objects.create(run=run, version=number, worker="explorer-a", seconds=0.1)
        WeightLoad.objects.filter(pk=load.pk).update(loaded_at=at + timedelta(seconds=every / 3))
    page = opened(browser, live_url, owner, run, size)
    try:
        page.wait_for_selector("#sync-chart canvas")
        page.locator("#sync-chart").scroll_into_view_if_needed()
        crowded = page.evaluate("""() => {
            const u = window.rftSyncPlot, ctx = document.createElement('canvas').getContext('2d'), out = [];
            u.axes.forEach((axis, i) => {
                const scale = i === 0 ? 'x' : 'y';
                const pos = axis._splits.map(v => u.valToPos(v, scale));
                ctx.font = axis.font ? axis.font[0] : '12px system-ui';
                const px = uPlot.pxRatio || devicePixelRatio || 1;
                const size = axis._values.map(t => i === 0
                    ? Math.max(...String(t).split('\\n').map(l => ctx.measureText(l).width)) / px
                    : parseFloat(ctx.font) / px);
                for (let k = 1; k < pos.length; k++) {
                    const room = Math.abs(pos[k] - pos[k - 1]), need = (size[k] + size[k - 1]) / 2 + 2;
                    if (String(axis._values[k]) && String(axis._values[k - 1]) && room < need)
                        out.push(scale + ': ' + axis._values[k - 1] + ' / ' + axis._values[k] + ' ' + room.toFixed(1) + ' < ' + need.toFixed(1));
                }
            });
            return out;
        }""")
        assert crowded == [], crowded
        assert page.evaluate("() => window.rftSyncPlot.axes[0]._values.filter(String).length") >= 2
        screenshot(page.locator("#sync-chart"), f"weight-sync-{size['width']}-{every}")
    finally:
        page.context.close()


def test_annotate_is_not_offered_on_an_auto_feedback_run_nor_a_failed_one(browser: Any, live_url: str,
                                                                        owner: User) -> None:
    auto = running(owner, name="auto only")  # feedback auto, no reward model, no corrections
    failed = running(owner, name="failed", feedback={"mode": "blend"})
    run_transition(run=failed, action="fail", reason="explore step 1 failed 3 times in a row")
    human = running(owner, name="human", feedback={"mode": "blend"})
    page = opened(browser, live_url, owner, auto)
    try:
        assert page.locator("a.annotate-link").count() == 0
        page.goto(f"/runs/{failed.pk}/")
        assert page.locator("a.annotate-link").count() == 0
        page.goto("/runs/")
        page.wait_for_selector(f"tr[data-run='{human.pk}']")
        assert page.locator(f"tr[data-run='{human.pk}'] a.annotate-link").count() == 1
        for run in (auto, failed):
            assert page.locator(f"tr[data-run='{run.pk}'] a.annotate-link").count() == 0
    finally:
        page.context.close()
