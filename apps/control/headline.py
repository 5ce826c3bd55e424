"""The run page's headline (issue 64): what people teach, before the raw series.

- the share the guidelines teach (the run's first `eval.preferences`, measured on held-out
  answers and never rewarded), version 0 -> the newest evaluated version, each with its 95%
  interval over the evaluation's tasks (kernel.eval_series.share_interval), and what the
  figures count (tasks, samples, greedy or sampled); a run without a taught preference
  heads with the metric its best version is chosen by (accuracy where verified);
- its twin's beside it: the twin comparison's own figures for that share
  (apps.control.twins, the people run's gain less the twin's with its interval);
- the blind verdict, where a blind evaluation has votes (apps.evaluation: win rates with
  their intervals, "too few votes to tell");
- three held-out prompts answered by version 0 and by the newest, side by side: the answers
  the blind evaluations cached. None is generated here: without them the headline says so.

A read: no writes."""

from __future__ import annotations

from dataclasses import dataclass

from apps.control.twins import ShareGain, TwinComparison
from apps.evaluation.selectors import BlindVerdict, SideBySide, answers_side_by_side, blind_verdict
from apps.runs.models import Metric, Run
from apps.runs.selectors import TASKS_METRIC, EvalBasis, best_by_options, eval_basis, taught_preference
from kernel.eval_series import PREFERENCE, PREFIX, change_interval, change_words, is_share, metric_label, share_interval


@dataclass(frozen=True)
class Point:
    """One evaluation's value of the headline's metric: the version, its train step, the
    value, the tasks counted, and the 95% interval where the metric is a share."""

    version: int
    step: int
    value: float
    tasks: int | None
    low: float | None
    high: float | None


@dataclass(frozen=True)
class Headline:
    metric: str
    label: str
    # The taught preference's name ("working"), else "".
    preference: str
    # Whether the metric is the share the guidelines teach (else the run's best-by default).
    taught: bool
    start: Point | None
    now: Point | None
    # start -> now: the change, its 95% interval and its words ("rose", "fell", "no clear change").
    change: float | None
    change_low: float | None
    change_high: float | None
    change_words: str
    basis: EvalBasis | None
    # The twin comparison's row for the metric (None: no twin, or not both evaluated yet).
    twin_gain: ShareGain | None
    twin: TwinComparison | None
    blind: BlindVerdict | None
    answers: SideBySide | None


def _point(*, run: Run, metric: str, step: int, value: float, versions: dict[int, float],
           tasks: dict[int, float]) -> Point:
    n = int(tasks[step]) if tasks.get(step) else None
    low, high = share_interval(value, n) if n and is_share(metric) else (None, None)
    return Point(version=int(versions.get(step, 0)), step=step, value=value, tasks=n, low=low, high=high)


def headline_metric(*, run: Run) -> tuple[str, bool]:
    """(metric, taught): the taught preference's share where the run has guidelines and
    preferences, else the first metric the best version may be chosen by ("" before any)."""
    taught = taught_preference(run=run)
    if taught is not None:
        return f"{PREFIX}{PREFERENCE}{taught}", True
    options = best_by_options(run=run)
    return (options[0][0] if options else ""), False


def run_headline(*, run: Run, twin: TwinComparison | None) -> Headline:
    """The headline of `run`'s page; `twin`: the page's twin comparison (apps.control.twins)."""
    metric, taught = headline_metric(run=run)
    rows = (Metric.objects.filter(run=run, name__in=[metric, TASKS_METRIC, f"{PREFIX}version"])
            .order_by("step", "id").values_list("name", "step", "value"))
    series: dict[str, dict[int, float]] = {}
    for name, step, value in rows:
        series.setdefault(name, {})[step] = value
    values, tasks, versions = series.get(metric, {}), series.get(TASKS_METRIC, {}), series.get(f"{PREFIX}version", {})
    start = now = None
    if values:
        first, last = min(values), max(values)
        start = _point(run=run, metric=metric, step=first, value=values[first], versions=versions, tasks=tasks)
        now = _point(run=run, metric=metric, step=last, value=values[last], versions=versions, tasks=tasks)
    low = high = None
    if start is not None and now is not None and now.step != start.step and start.tasks and now.tasks and is_share(metric):
        low, high = change_interval(start.value, start.tasks, now.value, now.tasks)
    gain = next((g for g in twin.shares if g.name == metric), None) if twin is not None else None
    return Headline(metric=metric, label=metric_label(metric) if metric else "", taught=taught, start=start, now=now,
                    preference=metric.removeprefix(PREFIX + PREFERENCE) if taught else "",
                    change=now.value - start.value if start is not None and now is not None else None,
                    change_low=low, change_high=high,
                    change_words=change_words((low, high)) if low is not None and high is not None else "",
                    basis=eval_basis(run=run, tasks=now.tasks) if now is not None else None, twin_gain=gain, twin=twin, blind=blind_verdict(run=run),
                    answers=answers_side_by_side(run=run))
