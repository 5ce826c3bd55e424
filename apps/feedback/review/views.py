"""The review page of a run (its owner's, and staff's): labels newest first with filters, accept
and reject on each (an HTMX partial, or a plain form that comes back to the page), and the
disagreements with their resolution. Thin: check the role, call a selector or a service
(apps.feedback.review.services), render."""

from __future__ import annotations

from math import ceil
from urllib.parse import urlencode

from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from apps.feedback.kinds import kind_get, kind_names
from apps.feedback.review.services import (
    Resolution,
    ReviewOutcome,
    disagreement_answer,
    disagreement_resolve,
    feedback_accept,
    feedback_reject,
)
from apps.feedback.review.selectors import (
    REVIEW_PAGE_SIZE,
    REVIEW_STATES,
    ReviewFilters,
    disagreements,
    review_counts,
    review_filters_parse,
    review_people,
    review_rows,
    review_rows_count,
)
from apps.runs.access import run_for_page
from apps.runs.models import Run
from kernel.exceptions import RftError
from rftweb.http import HtmxHttpRequest, not_found_first, refusals, signed_in


# Open disagreements shown above the labels (each with its forms); the others are a link away.
DISAGREEMENTS_SHOWN = 10


def _page_url(run: Run, filters: ReviewFilters | None = None) -> str:
    base = reverse("review:page", kwargs={"run_id": run.pk})
    query = filters.query() if filters else {}
    return f"{base}?{urlencode(query)}" if query else base


def _context(run: Run, filters: ReviewFilters, *, error: str = "", message: str = "") -> dict[str, object]:
    found = disagreements(run=run)
    total = review_rows_count(run=run, filters=filters, open_disagreements=found)
    pages = max(1, ceil(total / REVIEW_PAGE_SIZE))
    page = min(filters.page, pages)  # a page past the end (after rejections) shows the last one
    return {
        "run": run, "filters": filters, "error": error, "message": message,
        "rows": review_rows(run=run, filters=filters, open_disagreements=found, limit=REVIEW_PAGE_SIZE,
                            offset=(page - 1) * REVIEW_PAGE_SIZE),
        # The disagreements shown above the labels; the rest through "disagreements only".
        "disagreements": found[:DISAGREEMENTS_SHOWN], "disagreements_open": len(found),
        "disagreements_more": max(0, len(found) - DISAGREEMENTS_SHOWN),
        "counts": review_counts(run=run), "people": review_people(run=run),
        "kinds": [(name, kind_get(name).noun(2)) for name in kind_names(reviewable=True)],
        "states": REVIEW_STATES, "query": urlencode(filters.query(page=None)),
        "page": page, "pages": pages, "total": total,
        "newer_query": urlencode(filters.query(page=page - 1)) if page > 1 else None,
        "older_query": urlencode(filters.query(page=page + 1)) if page < pages else None,
        "disputed_query": urlencode(ReviewFilters(disagreements=True).query()),
    }


def _filters_refused(request: HtmxHttpRequest, error: RftError, run_id: int) -> HttpResponse:
    """A filter that does not parse: the whole page, unfiltered, with the message (a 400)."""
    run, _ = run_for_page(user=request.user, run_id=run_id, need="owner")
    return render(request, "feedback/review.html", _context(run, ReviewFilters(), error=error.message), status=400)


@login_required
@require_GET
@refusals(_filters_refused)
def review_page(request: HtmxHttpRequest, run_id: int) -> HttpResponse:
    run, _ = run_for_page(user=request.user, run_id=run_id, need="owner")
    filters = review_filters_parse(request.GET)
    message = str(request.session.pop("review_message", ""))  # a plain form's outcome, once
    if request.htmx and request.htmx.target == "review-body":  # a page link: the list alone
        return render(request, "feedback/_review_body.html", _context(run, filters, message=message))
    return render(request, "feedback/review.html", _context(run, filters, message=message))


def _filters_of(request: HtmxHttpRequest) -> ReviewFilters:
    try:
        return review_filters_parse(request.POST)
    except RftError:
        return ReviewFilters()


def _said(outcome: ReviewOutcome) -> str:
    return f"{kind_get(outcome.feedback.kind).noun(1).capitalize()} #{outcome.feedback.pk} {outcome.feedback.review}: {outcome.effect}."


def _after(request: HtmxHttpRequest, run: Run, *, message: str = "", error: str = "") -> HttpResponse:
    """HTMX: the page's body (list and disagreements) again, with the outcome; a plain form:
    back to the page with the same filters (the outcome in the query, as words)."""
    filters = _filters_of(request)
    if request.htmx:
        return render(request, "feedback/_review_body.html", _context(run, filters, message=message, error=error),
                      status=400 if error else 200)
    if error:
        return render(request, "feedback/review.html", _context(run, filters, error=error), status=400)
    url = _page_url(run, filters)
    request.session["review_message"] = message
    return redirect(url)


def _decision_refused(request: HtmxHttpRequest, error: RftError, run_id: int, **_: object) -> HttpResponse:
    """A decision refused (a label already decided, a disagreement gone): the outcome's place
    shows the message (`_after`)."""
    run, _role = run_for_page(user=request.user, run_id=run_id, need="owner")
    return _after(request, run, error=error.message)


def _decide(request: HtmxHttpRequest, run_id: int, feedback_id: int, *, reject: bool) -> HttpResponse:
    run, _ = run_for_page(user=request.user, run_id=run_id, need="owner")
    service = feedback_reject if reject else feedback_accept
    outcome = service(run=run, feedback_id=feedback_id, reviewer=signed_in(request))
    return _after(request, run, message=_said(outcome))


@login_required
@require_POST
@refusals(not_found_first(_decision_refused))
def label_accept(request: HtmxHttpRequest, run_id: int, feedback_id: int) -> HttpResponse:
    return _decide(request, run_id, feedback_id, reject=False)


@login_required
@require_POST
@refusals(not_found_first(_decision_refused))
def label_reject(request: HtmxHttpRequest, run_id: int, feedback_id: int) -> HttpResponse:
    return _decide(request, run_id, feedback_id, reject=True)


def _number(raw: object) -> int | None:
    text = str(raw or "").strip()
    return int(text) if text.isdigit() and len(text) < 19 else None


def _resolution_said(resolution: Resolution) -> str:
    rejected = ", ".join(f"#{o.feedback.pk}" for o in resolution.rejected) or "none"
    return (f"Kept {kind_get(resolution.kept.feedback.kind).noun(1)} #{resolution.kept.feedback.pk}; rejected {rejected}."
            + (f" {resolution.rejected[0].effect[:1].upper()}{resolution.rejected[0].effect[1:]}."
               if resolution.rejected else ""))


@login_required
@require_POST
@refusals(not_found_first(_decision_refused))
def disagreement_resolve_view(request: HtmxHttpRequest, run_id: int, group_id: str) -> HttpResponse:
    """Accept one side (`keep`: a label's id) or give one's own label (`experience_id` with
    `score`, or with `other_id` and `winner`)."""
    run, _ = run_for_page(user=request.user, run_id=run_id, need="owner")
    post = request.POST
    if post.get("keep"):
        keep = _number(post.get("keep"))
        if keep is None:
            return _after(request, run, error="keep: give the id of the label to keep")
        resolution = disagreement_resolve(run=run, group_id=group_id, keep=keep, reviewer=signed_in(request))
    else:
        resolution = disagreement_answer(
            run=run, group_id=group_id, reviewer=signed_in(request), experience_id=_number(post.get("experience_id")),
            score=_number(post.get("score")), other_id=_number(post.get("other_id")),
            winner=str(post.get("winner") or "") or None)
    return _after(request, run, message=_resolution_said(resolution))
