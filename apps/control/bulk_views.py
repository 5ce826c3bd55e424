"""The experience browser's bulk actions (apps/feedback/bulk.py): a selection by checkboxes,
or every experience matching the browser's filter, then an action, confirmed on a page that
shows the count. Works without JavaScript (static/rftweb/bulk.js only ticks boxes)."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpResponse, HttpResponseBase, StreamingHttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from apps.buffer.selectors import experience_filters_parse
from apps.control.selectors import experiences_matching_ids
from apps.feedback.bulk import BULK_ACTIONS, BULK_MAX, bulk_allowed, bulk_ids, experiences_bulk, experiences_export
from apps.runs.access import run_for_page
from apps.runs.models import Run
from kernel.exceptions import InvalidInput, RftError
from rftweb.http import HtmxHttpRequest, refusals

_RUNS = Run.objects.select_related("owner", "taskset")


def _back(request: HtmxHttpRequest, run_id: int) -> str:
    """The experience browser with the filter the action came from."""
    filters = experience_filters_parse(request.POST)
    return reverse("runs:experiences", kwargs={"run_id": run_id}) + "?" + filters.query(before=None)


def _selection_refused(request: HtmxHttpRequest, error: RftError, run_id: int) -> HttpResponse:
    """A selection that cannot be acted on: the confirmation page says why, with the way back."""
    run, _ = run_for_page(user=request.user, run_id=run_id, runs=_RUNS)
    return render(request, "runs/bulk_confirm.html", {
        "run": run, "error": error.message, "back": _back(request, run_id)}, status=error.status)


@login_required
@require_POST
@refusals(_selection_refused)
def experience_bulk(request: HtmxHttpRequest, run_id: int) -> HttpResponseBase:
    run, _ = run_for_page(user=request.user, run_id=run_id, runs=_RUNS)
    action = request.POST.get("action", "")
    scope = request.POST.get("scope", "")
    filters = experience_filters_parse(request.POST)
    back = _back(request, run.pk)
    ids: list[int] = []
    bulk_allowed(run=run, user=request.user, action=action)
    if scope == "filter":
        if filters.errors:
            raise InvalidInput("fix the filter before acting on what it matches", field="filter")
        ids = experiences_matching_ids(run=run, filters=filters, limit=BULK_MAX)
        if len(ids) > BULK_MAX:
            raise InvalidInput(f"more than {BULK_MAX} experiences match: narrow the filter", field="ids")
        if not ids:
            raise InvalidInput("no experience matches the filter", field="ids")
    else:
        ids = bulk_ids(run=run, ids=request.POST.getlist("ids"))
    chosen = BULK_ACTIONS[action]
    if request.POST.get("confirm") != "yes":
        return render(request, "runs/bulk_confirm.html", {
            "run": run, "action": chosen, "count": len(ids), "question": chosen.question.format(n=len(ids)),
            "scope": scope, "ids": ids if scope != "filter" else [], "filter_fields": filter_fields(filters.query(before=None)),
            "back": back})
    if action == "export":
        response = StreamingHttpResponse(experiences_export(run=run, user=request.user, ids=ids),
                                         content_type="application/jsonl; charset=utf-8")
        response["Content-Disposition"] = f'attachment; filename="run-{run.pk}-experiences-{len(ids)}.jsonl"'
        return response
    return _bulk_act(request, run, ids=ids)


def _action_refused(request: HtmxHttpRequest, error: RftError, run: Run, **_: object) -> HttpResponseBase:
    """An action refused once confirmed: back to the browser, the refusal named by the action."""
    messages.error(request, f"{BULK_ACTIONS[request.POST.get('action', '')].label}: {error.message}")
    return redirect(_back(request, run.pk))


@refusals(_action_refused)
def _bulk_act(request: HtmxHttpRequest, run: Run, *, ids: list[int]) -> HttpResponseBase:
    """The confirmed action on `ids`, said on the browser's next page."""
    action = request.POST.get("action", "")
    chosen = BULK_ACTIONS[action]
    result = experiences_bulk(run=run, user=request.user, action=action, ids=ids,
                              reason=request.POST.get("reason", "")[:500])
    said = f"{chosen.label}: {result.count} experience{'s' if result.count != 1 else ''}"
    if result.skipped:
        said += f"; {result.skipped} left as they were ({result.why_skipped})"
    messages.success(request, said + ".")
    return redirect(_back(request, run.pk))


def filter_fields(query: str) -> list[tuple[str, str]]:
    from urllib.parse import parse_qsl

    return parse_qsl(query)


def bulk_context(*, run: Run, role: str) -> dict[str, object]:
    """What the browser's bulk bar offers this person: the actions their role allows."""
    return {"bulk_actions": [a for a in BULK_ACTIONS.values() if role in a.roles]}


