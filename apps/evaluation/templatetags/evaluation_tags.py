"""The blind evaluations' parts of other apps' pages, each one line in their templates:

  {% load evaluation_tags %}{% blind_evaluations run twin %}   the run page and its summary:
      the evaluations with their figures, a link to vote, and the owner's form to ask for one
      (offering the run's twin's newest version too, where the page has a twin)
  {% load evaluation_tags %}{% blind_votes_waiting run %}  the annotation page: the pairs
      waiting for the signed-in person's vote
"""

from __future__ import annotations

from django import template
from django.template.context import Context

from apps.evaluation.api import figures_body
from apps.evaluation.selectors import evaluation_figures, evaluations_to_vote, labels, run_evaluations, votes_waiting
from apps.runs.models import Run
from apps.runs.selectors import run_role

register = template.Library()

SHOWN = 5


def suggested_versions(run: Run, twin: object = None) -> str:
    """The versions the owner's form offers: the starting model against the newest, and the
    newest of the run's twin (the run copied with nobody rating it: `twin`, the run page's
    apps.control.twins.TwinComparison, when this run is the one people taught)."""
    suggested = f"0,{run.current_version}"
    people, other = getattr(twin, "people", None), getattr(twin, "twin", None)
    if isinstance(people, Run) and isinstance(other, Run) and people.pk == run.pk and other.current_version:
        suggested += f",{other.pk}:{other.current_version}"
    return suggested


@register.inclusion_tag("evaluation/_section.html", takes_context=True)
def blind_evaluations(context: Context, run: Run, twin: object = None) -> dict[str, object]:
    user = context.get("user")
    role = run_role(run=run, user=user) if user is not None else None
    # One query on a run without evaluations (the run page's budget: tests/test_query_budgets.py).
    rows = [{"evaluation": e, "versions": labels(e), "figures": figures_body(e, evaluation_figures(e)),
             "may_vote": user is not None and votes_waiting(evaluation=e, user=user, role=role)}
            for e in run_evaluations(run=run)[:SHOWN]]
    suggested = suggested_versions(run, twin)
    return {"run": run, "rows": rows, "is_owner": role == "owner", "csrf_token": context.get("csrf_token"),
            "newest": run.current_version, "suggested": suggested if run.current_version else "",
            "with_twin": suggested.count(",") > 1, "ended": run.status in ("finished", "stopped")}


@register.inclusion_tag("evaluation/_waiting.html", takes_context=True)
def blind_votes_waiting(context: Context, run: Run) -> dict[str, object]:
    user = context.get("user")
    return {"waiting": evaluations_to_vote(user=user, run=run) if user is not None else []}
