"""Owner pages of the run's human feedback: the Raters page (agreement, per-rater figures, gold
items), the reward-model panel of the run page, and the preference export. Thin: check the
role, call a selector or service, render."""

from __future__ import annotations

import json

from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import User
from django.http import FileResponse, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from apps.feedback.reward_model.versions import reward_model_summary
from apps.feedback.reward_model.preferences import preference_pairs, preference_rows_trl
from apps.feedback.raters.figures import raters_data
from apps.rewards.rm_download import (
    download_name,
    export_states,
    export_zip_path,
    reward_model_export_request,
    reward_model_version_get,
)
from apps.rewards.gold import gold_item_mark, gold_item_unmark
from apps.rewards.models import GoldItem
from apps.runs.access import run_for_page
from apps.runs.models import Run
from kernel.exceptions import InvalidInput, RftError
from rftweb.http import HtmxHttpRequest, fragment, not_found_first, refusals, refused_as_text
from kernel.jsontypes import Body


def _raters_refused(request: HtmxHttpRequest, error: RftError, run_id: int) -> HttpResponse:
    """A gold item that cannot be marked or unmarked: the page again, the refusal above it."""
    run, _ = run_for_page(user=request.user, run_id=run_id, need="owner")
    return _raters(request, run, error=str(error))


@login_required
@require_http_methods(["GET", "POST"])
@refusals(_raters_refused)
def raters_page(request: HtmxHttpRequest, run_id: int) -> HttpResponse:
    run, _ = run_for_page(user=request.user, run_id=run_id, need="owner")
    if request.method == "POST":
        if request.POST.get("unmark"):
            if not request.POST["unmark"].isdigit():
                raise InvalidInput("give the id of a gold item's experience", field="unmark")
            gold_item_unmark(run=run, experience_id=int(request.POST["unmark"]))
        else:
            gold_item_mark(run=run, experience_id=request.POST.get("experience", ""),
                           score=request.POST.get("score", ""),
                           actor=request.user if isinstance(request.user, User) else None)  # login_required: a User
        if not request.htmx:
            return redirect("rewards:raters", run_id=run.pk)
    return _raters(request, run)


def _raters(request: HtmxHttpRequest, run: Run, *, error: str = "") -> HttpResponse:
    data = raters_data(run=run)
    context = {"run": run, "data": data, "figures": data["raters"], "agreement": data["agreement"],
               "gold": GoldItem.objects.filter(run=run).select_related("experience").order_by("-id")[:100],
               "error": error}
    response = render(request, "rewards/raters.html", context)
    if error:
        response.status_code = 400
    return response


@login_required
@require_GET
def raters_json(request: HtmxHttpRequest, run_id: int) -> JsonResponse:
    run, _ = run_for_page(user=request.user, run_id=run_id, need="owner")
    return JsonResponse(raters_data(run=run))


def reward_model_panel_context(*, run: Run, role: str) -> Body:
    """The reward-model panel's context (the run page includes the panel; the panel's own
    URL refreshes it): the summary, the hand-out rule and, for the owner, each version's
    download state."""
    rm = reward_model_summary(run=run)
    owner = role == "owner"
    states = export_states(rm["versions"]) if owner else {}
    return {"rm": rm, "selection": run.cfg.feedback.selection, "trust": run.cfg.feedback.trust,
            "weighting": run.cfg.feedback.rater_weighting, "rm_owner": owner,
            "rm_rows": [(v, states.get(v.version)) for v in rm["versions"]]}


def _reward_model_panel(request: HtmxHttpRequest, run: Run, role: str, *, status: int = 200) -> HttpResponse:
    context = {"run": run, **reward_model_panel_context(run=run, role=role), "page_title": f"Reward model · {run.name}"}
    return fragment(request, "rewards/_reward_model.html", context, status=status)


@login_required
@require_GET
def reward_model_panel(request: HtmxHttpRequest, run_id: int) -> HttpResponse:
    run, role = run_for_page(user=request.user, run_id=run_id)
    return _reward_model_panel(request, run, role)


@login_required
@require_POST
@refusals(not_found_first(refused_as_text))
def reward_model_export(request: HtmxHttpRequest, run_id: int, version: int) -> HttpResponse:
    """Ask for a version's download (a `reward` worker packs it); the panel shows
    "preparing" and, once the zip is there, the link."""
    run, role = run_for_page(user=request.user, run_id=run_id, need="owner")
    reward_model_export_request(run=run, version=version)
    if not request.htmx:
        return redirect("rewards:reward_model", run_id=run.pk)
    return _reward_model_panel(request, run, role)


@login_required
@require_GET
@refusals(not_found_first(refused_as_text))
def reward_model_download(request: HtmxHttpRequest, run_id: int, version: int) -> HttpResponse | FileResponse:
    """The version's zip (what `rft reward-model` writes), once a worker packed it."""
    run, _ = run_for_page(user=request.user, run_id=run_id, need="owner")
    rm = reward_model_version_get(run=run, version=version)
    path = export_zip_path(rm)
    if not path.is_file():
        return HttpResponse(f"reward model v{version} is not packed yet: ask for it on the run page "
                            "(reward model, prepare .zip) and wait for the link", status=409, content_type="text/plain")
    return FileResponse(path.open("rb"), as_attachment=True, filename=download_name(rm),
                        content_type="application/zip")


@login_required
@require_GET
def preferences_export(request: HtmxHttpRequest, run_id: int) -> HttpResponse:
    """The run's preference pairs in TRL's prompt / chosen / rejected format, as JSON lines
    (people's preferences: few enough to answer in one piece)."""
    run, _ = run_for_page(user=request.user, run_id=run_id, need="owner")
    rows = preference_rows_trl(preference_pairs(run=run))
    response = HttpResponse("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows),
                            content_type="application/x-ndjson")
    response["Content-Disposition"] = f'attachment; filename="run-{run.pk}-preferences.jsonl"'
    return response
