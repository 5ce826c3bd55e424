"""The run page's charts as an owner uses them (issue 17, the wandb anchor), in a real browser
against a real server: smoothing, zoom that survives live points, values under the cursor, wall
time instead of steps, the held-out evaluation chart, and another run on the same chart. Each
test reads what the chart draws (uPlot's data, scales and legend), not what the page stores."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import expect

from apps.runs.metrics import metric_record
from apps.runs.models import Metric, Run
from apps.runs.services import eval_result_record, run_transition
from tests.dashboard.test_pages_live import in_a_thread, in_another_process, log_in
from tests.factories import make_run, make_taskset, make_user
from tests.servers import BROWSER_WAIT_MS, screenshot

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def owner() -> User:
    return make_user("owner")


def running(owner: User, name: str = "demo") -> Run:
    run = make_run(owner=owner, taskset=make_taskset(owner=owner), name=name)
    run_transition(run=run, action="start", actor=owner)
    return run


def open_run(page: Any, owner: User, run: Run, chart: str) -> None:
    log_in(page, owner)
    page.goto(f"/runs/{run.pk}/")
    page.wait_for_selector(f"#chart-{chart} canvas")
    page.wait_for_selector("#live[data-state=live]")


def plot(page: Any, chart: str, expression: str) -> Any:
    """`expression` evaluated with `u` bound to the chart's uPlot instance."""
    return page.evaluate(f"() => {{ const u = window.rftCharts[{chart!r}].plot; return {expression}; }}")


def point_on(page: Any, chart: str, step: float) -> dict[str, float]:
    """Page coordinates of `step` on the chart's x axis, half way up the plotting area, the chart
    scrolled into view first (the mouse reaches only the viewport; the run page's sections above
    the charts grew in round 61)."""
    page.locator(f"#chart-{chart}").scroll_into_view_if_needed()
    return plot(page, chart, f"(() => {{ const r = u.over.getBoundingClientRect(); "
                             f"return {{x: r.left + u.valToPos({step}, 'x'), y: r.top + r.height / 2}}; }})()")


def ema(values: list[float], weight: float) -> list[float]:
    out: list[float] = []
    for v in values:
        out.append(v if not out else weight * out[-1] + (1 - weight) * v)
    return out


def test_smoothing_averages_the_curve_and_hovering_shows_the_values_at_the_cursor(page: Any, owner: User) -> None:
    run = running(owner)
    raw = [1.0, 0.0, 1.0, 0.0, 1.0, 0.0]
    for step, value in enumerate(raw, start=1):
        metric_record(run=run, step=step, values={"loss": value})
    open_run(page, owner, run, "loss")
    assert plot(page, "loss", "u.data[1]") == raw
    assert page.locator("#section-loss #chart-loss").count() == 1  # in its section: loss and KL

    page.locator("#chart-smooth").fill("0.5")
    expect(page.locator("#chart-smooth-value")).to_have_text("0.5")
    assert plot(page, "loss", "u.data[1]") == pytest.approx(ema(raw, 0.5))
    assert plot(page, "loss", "u.data[0]") == [1, 2, 3, 4, 5, 6]  # same steps, smoothed values

    # The legend under the chart reads the step and the (smoothed) value under the cursor.
    at = point_on(page, "loss", 3)
    page.mouse.move(at["x"], at["y"])
    values = page.locator("#chart-loss .u-legend .u-series .u-value")
    expect(values.nth(0)).to_have_text("3")
    expect(values.nth(1)).to_have_text("0.75")  # 1, then 0.5·1 + 0.5·0, then 0.5·0.5 + 0.5·1
    at = point_on(page, "loss", 5)
    page.mouse.move(at["x"], at["y"])
    expect(values.nth(0)).to_have_text("5")
    expect(values.nth(1)).to_have_text("0.6875")

    page.locator("#chart-smooth").fill("0")
    assert plot(page, "loss", "u.data[1]") == raw


def test_a_drag_zooms_the_chart_the_zoom_survives_live_points_and_a_double_click_resets_it(page: Any,
                                                                                            owner: User) -> None:
    run = running(owner)
    for step in range(1, 11):
        metric_record(run=run, step=step, values={"reward/mean": step / 10})
    open_run(page, owner, run, "reward")
    assert plot(page, "reward", "[u.scales.x.min, u.scales.x.max]") == [1, 10]

    start, end = point_on(page, "reward", 3), point_on(page, "reward", 6)
    page.mouse.move(start["x"], start["y"])
    page.mouse.down()
    page.mouse.move(end["x"], end["y"], steps=5)
    page.mouse.up()
    low, high = plot(page, "reward", "[u.scales.x.min, u.scales.x.max]")
    assert low == pytest.approx(3, abs=0.2) and high == pytest.approx(6, abs=0.2), (low, high)

    # A point arrives from a trainer: drawn, and the zoomed range stays where the owner put it.
    in_another_process("from apps.runs.models import Run; from apps.runs.services import metric_record; "
                       f"metric_record(run=Run.objects.get(pk={run.pk}), step=11, values={{'reward/mean': 0.05}})")
    expect(page.locator("#chart-reward")).to_have_attribute("data-points", "11", timeout=BROWSER_WAIT_MS)
    assert plot(page, "reward", "u.data[0].length") == 11
    # One compact line says what just happened; the raw events stay folded away.
    assert "metrics at step 11" in page.inner_text("#live-line")
    assert page.locator("details.event-details").get_attribute("open") is None
    assert plot(page, "reward", "[u.scales.x.min, u.scales.x.max]") == [low, high]

    page.dblclick("#chart-reward .u-over")
    page.wait_for_function("() => window.rftCharts.reward.plot.scales.x.max === 11")
    assert plot(page, "reward", "u.scales.x.min") == 1


def test_wall_time_replaces_steps_on_the_x_axis_and_back(page: Any, owner: User) -> None:
    run = running(owner)
    for step in (1, 2, 3):
        metric_record(run=run, step=step, values={"reward/mean": 0.1 * step})
    times = [round(m.time.timestamp(), 3) for m in Metric.objects.filter(run=run).order_by("step")]
    open_run(page, owner, run, "reward")
    assert plot(page, "reward", "u.data[0]") == [1, 2, 3]

    page.select_option("#chart-x", "time")
    page.wait_for_function("() => window.rftCharts.reward.plot.scales.x.time === true")
    assert plot(page, "reward", "u.data[0]") == pytest.approx(sorted(times))
    assert plot(page, "reward", "u.data[1]") == pytest.approx([0.1, 0.2, 0.3])
    # The ticks are times of day, not step numbers.
    ticks = [str(t) for t in plot(page, "reward", "u.axes[0]._values") if t]
    assert ticks and not any(t.isdigit() and int(t) < 100 for t in ticks), ticks
    # The legend names the time under the cursor (the chart scrolled into view: the run page's
    # headline stands above the charts).
    page.locator("#chart-reward").scroll_into_view_if_needed()
    at = plot(page, "reward", f"(() => {{ const r = u.over.getBoundingClientRect(); "
                              f"return {{x: r.left + u.valToPos({times[1]}, 'x'), y: r.top + 10}}; }})()")
    page.mouse.move(at["x"], at["y"])
    assert ":" in page.locator("#chart-reward .u-legend .u-series .u-value").nth(0).inner_text()

    page.select_option("#chart-x", "step")
    page.wait_for_function("() => window.rftCharts.reward.plot.scales.x.time === false")
    assert plot(page, "reward", "u.data[0]") == [1, 2, 3]


def _eval(version: int, mean: float) -> dict[str, float]:
    # What workers/explore/evaluation.py records for a version.
    return {"eval/reward_mean": mean, "eval/reward_std": 0.1, "eval/accuracy": mean, "eval/format_share": 1.0,
            "eval/response_length": 40.0, "eval/version": float(version), "eval/tasks": 5.0, "eval/seconds": 1.5}


def test_held_out_evaluation_has_its_chart_and_the_best_version_follows_live(page: Any, owner: User) -> None:
    run = running(owner)
    for step in (1, 2):
        metric_record(run=run, step=step, values={"reward/mean": 0.1 * step, "response_length": 30.0 + step})
    open_run(page, owner, run, "reward")
    assert page.locator("#chart-eval").count() == 0
    assert page.is_hidden("#run-eval-best")

    # The evaluator scores version 1 at train step 2, from another thread as a worker would.
    in_a_thread(lambda: eval_result_record(run=run, version=1, step=2, values=_eval(1, 0.25)))
    page.wait_for_selector("#section-rewards #chart-eval canvas")
    page.wait_for_selector("#run-eval-best:not([hidden])")
    assert page.inner_text("#run-best-version") == "v1"
    # Scores on the evaluation chart, each under what it measures (accuracy is the domain's
    # verifier, the format share apart from it); length beside the training length; the rest a table.
    assert sorted(plot(page, "eval", "u.series.slice(1).map(s => s.label)")) == [
        "accuracy (the domain's verifier)", "evaluation reward mean", "evaluation reward std",
        "format share (well-formed answers)"]
    assert "evaluation response length" in plot(page, "length", "u.series.map(s => s.label)")
    # The header names the metric that chose the best version (the default: accuracy).
    assert page.inner_text("#run-best-metric") == "accuracy (the domain's verifier)"
    # The evaluation's bookkeeping has its own table, not "Constants" (issue 64 item 10).
    evaluation = page.locator("#constants-eval tr[data-metric]").evaluate_all("rs => rs.map(r => r.dataset.metric)")
    assert {"eval/version", "eval/tasks", "eval/best_version"} <= set(evaluation)
    assert page.locator("#constants-settings tr[data-metric^='eval/']").count() == 0

    in_a_thread(lambda: eval_result_record(run=run, version=2, step=4, values=_eval(2, 0.5)))
    expect(page.locator("#run-best-version")).to_have_text("v2", timeout=BROWSER_WAIT_MS)
    expect(page.locator("#chart-eval")).to_have_attribute("data-points", "2", timeout=BROWSER_WAIT_MS)
    assert page.inner_text("#run-best-value") == "0.500"
    # After a reload, the same chart from the server's series.
    page.reload()
    page.wait_for_selector("#chart-eval canvas")
    assert plot(page, "eval", "u.data[0]") == [2, 4]
    labels = plot(page, "eval", "u.series.map(s => s.label)")
    assert plot(page, "eval", f"u.data[{labels.index('evaluation reward mean')}]") == [0.25, 0.5]
    assert page.inner_text("#run-best-version") == "v2"
    # The evaluated version changed (1, then 2): its table shows the latest, and no chart draws it.
    expect(page.locator("#constants-eval tr[data-metric='eval/version'] td").nth(1)).to_have_text("2")
    expect(page.locator("#constants-eval tr[data-metric='eval/best_version'] td").nth(1)).to_have_text("2")
    assert page.locator("#chart-m-eval_version").count() == 0
    screenshot(page, "dashboard-evaluation")


def test_another_run_is_drawn_on_the_same_chart_with_its_own_values(page: Any, owner: User) -> None:
    a = running(owner)
    b = make_run(owner=owner, taskset=make_taskset(owner=owner), name="baseline")
    c = make_run(owner=owner, taskset=make_taskset(owner=owner), name="longer")
    for step in (1, 2, 3):
        metric_record(run=a, step=step, values={"reward/mean": 0.2 * step})
        metric_record(run=b, step=step, values={"reward/mean": 0.1 * step})
    for step in (1, 2, 3, 4, 5):
        metric_record(run=c, step=step, values={"reward/mean": 0.05 * step})
    other_owner = make_user("someone-else")
    hidden = make_run(owner=other_owner, name="not yours")
    open_run(page, owner, a, "reward")
    options = page.locator("#chart-compare option").evaluate_all("os => os.map(o => o.value)")
    assert str(hidden.pk) not in options and {str(b.pk), str(c.pk)} <= set(options)

    page.select_option("#chart-compare", str(b.pk))
    page.wait_for_selector("#chart-reward[data-series='2']")
    page.select_option("#chart-compare", str(c.pk))
    page.wait_for_selector("#chart-reward[data-series='3']")
    assert plot(page, "reward", "u.data[0]") == [1, 2, 3, 4, 5]  # the union of the runs' steps
    labels = plot(page, "reward", "u.series.slice(1).map(s => s.label)")
    values = plot(page, "reward", "u.data.slice(1).map(vs => vs.map(v => v === null ? null : +v.toFixed(6)))")
    drawn = dict(zip(labels, values, strict=True))
    assert labels[0] == "reward/mean"  # this run first, by the metric's name alone
    assert drawn == {"reward/mean": [0.2, 0.4, 0.6, None, None],
                     f"reward/mean (baseline #{b.pk})": [0.1, 0.2, 0.3, None, None],
                     f"reward/mean (longer #{c.pk})": [0.05, 0.1, 0.15, 0.2, 0.25]}
    # Each run has its own colour; the compared ones are dashed.
    strokes = plot(page, "reward", "u.series.slice(1).map(s => [s._stroke || s.stroke, !!s.dash])")
    assert len({str(s[0]) for s in strokes}) == 3 and [s[1] for s in strokes] == [False, True, True]
    screenshot(page, "dashboard-compare-three")

    # Comparing with nothing again leaves this run alone on the chart.
    for other in (b, c):
        page.click(f"#chart-compared .chip[data-run='{other.pk}']")
    page.wait_for_selector("#chart-reward[data-series='1']")
    assert plot(page, "reward", "u.data[0]") == [1, 2, 3]
