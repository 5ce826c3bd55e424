"""The blind vote page: `/vote/<evaluation token>/` shows the next pair for the signed-in
person, `/vote/<evaluation token>/<pair token>/` takes their vote and answers the pair after
it. Only opaque tokens travel: no URL, attribute, text or response of these views names the
run, a version or a step (tests/evaluation/test_vote_browser.py reads every one)."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from apps.evaluation.models import Evaluation
from apps.evaluation.selectors import evaluation_by_token, next_item, progress_of
from apps.evaluation.services import vote_cast, voter_check
from kernel.exceptions import NotFound, RftError
from rftweb.http import HtmxHttpRequest, signed_in

CHOICE_WORDS = {"left": "A is better", "right": "B is better", "tie": "Tie", "both_bad": "Both bad"}


def _evaluation_for(request: HtmxHttpRequest, token: str) -> Evaluation:
    evaluation = evaluation_by_token(token)
    if evaluation is None:
        raise Http404("no such evaluation")
    try:
        voter_check(evaluation=evaluation, user=signed_in(request))
    except NotFound:
        raise Http404("no such evaluation") from None
    return evaluation


def _refusal(error: RftError) -> HttpResponse:
    """Plain text naming the problem, at the error's status (the page's script shows it)."""
    return HttpResponse(error.message, status=error.status, content_type="text/plain; charset=utf-8")


def _context(request: HtmxHttpRequest, evaluation: Evaluation) -> dict[str, object]:
    person = signed_in(request)
    shown = next_item(evaluation=evaluation, user=person) if evaluation.status == Evaluation.Status.OPEN else None
    return {"evaluation": evaluation, "shown": shown, "choices": CHOICE_WORDS,
            "progress": shown.progress if shown else progress_of(evaluation=evaluation, user=person)}


@login_required
@require_GET
def vote_page(request: HtmxHttpRequest, token: str) -> HttpResponse:
    try:
        evaluation = _evaluation_for(request, token)
    except RftError as exc:
        return _refusal(exc)
    return render(request, "evaluation/vote.html", _context(request, evaluation))


@login_required
@require_POST
def vote_submit(request: HtmxHttpRequest, token: str, item: str) -> HttpResponse:
    evaluation = evaluation_by_token(token)
    if evaluation is None:
        raise Http404("no such evaluation")
    try:
        vote_cast(evaluation=evaluation, token=item, voter=signed_in(request),
                  choice=request.POST.get("choice", ""), comment=request.POST.get("comment", ""))
    except RftError as exc:
        return _refusal(exc)
    if not request.htmx:
        return redirect("evaluation:vote", token=token)
    evaluation.refresh_from_db()
    return render(request, "evaluation/_vote.html", _context(request, evaluation))
