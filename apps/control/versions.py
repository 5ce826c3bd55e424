"""Every published version of a run, downloadable, with the best chosen by a metric the owner
picks on the page (issue 64: "any version downloadable"). The run page and its summary show
the same panel; the best is apps.runs.selectors.eval_best's, given the picked metric (the
taught preference offered first where the run has guidelines, accuracy otherwise:
apps.runs.selectors.best_by_options), and the choice is named ("best by <metric>: vN").

Version 0 is the starting model (`cfg.model` names it): it has no weights to pack, so it is
listed with its evaluation but offers no download. A read: no writes."""

from __future__ import annotations

from dataclasses import dataclass

from apps.control.weights import WeightsExport, weights_export_states
from apps.runs.models import Metric, ModelVersion, Run
from apps.runs.selectors import (TASKS_METRIC, EvalBasis, EvalBest, best_by_options, eval_basis, eval_best,
                                 eval_metric_values)
from kernel.eval_series import is_share, metric_label, share_interval

# The query parameter that carries the owner's pick.
BEST_BY_PARAM = "best_by"


@dataclass(frozen=True)
class VersionRow:
    number: int
    train_step: int
    # The picked metric's value at the version's evaluation (None: not evaluated), its interval
    # where it is a share and the evaluation's task count is known.
    value: float | None
    low: float | None
    high: float | None
    # None for version 0 (nothing to pack).
    export: WeightsExport | None
    best: bool


@dataclass(frozen=True)
class VersionsPanel:
    metric: str
    label: str
    options: list[tuple[str, str]]
    best: EvalBest | None
    rows: list[VersionRow]
    basis: EvalBasis | None
    # A picked metric the run has no series of (the page says so, with a 400).
    error: str = ""
    picked: bool = False
    ended: bool = False

    @property
    def preparing(self) -> bool:
        """Whether a version is being packed (the panel then refreshes itself)."""
        return any(r.export is not None and r.export.preparing for r in self.rows)


def _rows(run: Run, metric: str, best: EvalBest | None) -> list[VersionRow]:
    versions = list(ModelVersion.objects.filter(run=run).order_by("-number"))
    values = eval_metric_values(run=run, metric=metric) if metric else {}
    tasks = dict(Metric.objects.filter(run=run, name=TASKS_METRIC).values_list("step", "value")) if metric else {}
    exports = weights_export_states(run=run, versions=[v for v in versions if v.number > 0])
    rows = []
    for v in versions:
        step_value = values.get(v.number)
        low = high = None
        if step_value is not None and is_share(metric) and tasks.get(step_value[0]):
            low, high = share_interval(step_value[1], tasks[step_value[0]])
        rows.append(VersionRow(number=v.number, train_step=v.train_step, value=step_value[1] if step_value else None,
                               low=low, high=high, export=exports.get(v.number),
                               best=best is not None and best["version"] == v.number))
    return rows


def versions_panel(*, run: Run, picked: str | None = None) -> VersionsPanel:
    """The panel for `run`, the best by `picked` (a metric name from the page's choices) or,
    without one, by the run's default (eval_best's). A pick that is none of the choices is
    named in `error` and the default is shown."""
    options = best_by_options(run=run)
    error = ""
    if picked is not None and picked not in dict(options):
        shown = ", ".join(name for name, _ in options) or "none: the run has no evaluation yet"
        error = f"best_by must be one of the run's evaluation series ({shown}), not {picked[:80]!r}"
        picked = None
    best = eval_best(run=run, metric=picked) if options else None  # no evaluation: nothing to choose by
    metric = picked or (best["metric"] if best else (options[0][0] if options else ""))
    return VersionsPanel(metric=metric, label=metric_label(metric) if metric else "", options=options, best=best,
                         rows=_rows(run, metric, best), basis=eval_basis(run=run) if options else None, error=error,
                         picked=picked is not None, ended=run.status in ("finished", "failed", "stopped"))
