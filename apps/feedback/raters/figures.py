"""The Raters figures as JSON-ready data: the Raters page (apps.feedback.raters.views) and the
API (apps.feedback.raters.api) show the same."""

from __future__ import annotations

from typing import TypedDict

from apps.feedback.raters.reliability import rater_figures, run_agreement
from apps.runs.models import Run
from kernel.jsontypes import Body


class RatersData(TypedDict):
    weighting: str
    gold_rate: float
    trust: Body
    agreement: dict[str, float | None]
    raters: list[Body]


def raters_data(*, run: Run) -> RatersData:
    """The Raters page's figures as JSON-ready data (the page and the API show the same)."""
    figures = rater_figures(run=run)
    return {
        "weighting": run.cfg.feedback.rater_weighting,
        "gold_rate": run.cfg.feedback.gold_rate,
        "trust": run.cfg.feedback.trust.model_dump(),
        "agreement": run_agreement(run=run),
        "raters": [f.as_dict() for f in figures],
    }
