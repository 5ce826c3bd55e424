"""The blind vote page: `/vote/<evaluation token>/` shows the next pair for the signed-in
person, `/vote/<evaluation token>/<pair token>/` takes their vote and answers the pair after
it (or, for a pair shown between annotation items, apps/evaluation/between.py, the finished
card). Only opaque tokens travel: no URL, attribute, text or response of these views names the
run, a version or a step (tests/evaluation/test_vote_browser.py reads every one)."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from apps.evaluation.between import card
from apps.evaluation.models import Evaluation, Item
from apps.evaluation.selectors import evaluation_by_token, next_item, progress_of
from apps.evaluation.services import vote_cast, voter_check
from kernel.exceptions import Conflict, InvalidInput, NotFound, RftError
from rftweb.http import HtmxHttpRequest, refusals, refused_as_text, signed_in

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




def _context(request: HtmxHttpRequest, evaluation: Evaluation) -> dict[str, object]:
    person = signed_in(request)
    shown = next_item(evaluation=evaluation, user=person) if evaluation.status == Evaluation.Status.OPEN else None
    return {"evaluation": evaluation, "shown": shown, "choices": CHOICE_WORDS,
            "progress": shown.progress if shown else progress_of(evaluation=evaluation, user=person)}


@login_required
@require_GET
@refusals(refused_as_text)
def vote_page(request: HtmxHttpRequest, token: str) -> HttpResponse:
    evaluation = _evaluation_for(request, token)
    return render(request, "evaluation/vote.html", _context(request, evaluation))


def _vote_refused(request: HtmxHttpRequest, error: RftError, token: str, item: str) -> HttpResponse:
    """A card between annotation items that can no longer be voted on (closed, voted, all its
    votes in: a Conflict) is finished with the reason; other refusals as the vote page's."""
    between = request.POST.get("shown_in") == "between"
    evaluation = evaluation_by_token(token)
    if between and request.htmx and isinstance(error, Conflict) and evaluation is not None:
        return _between_done(request, evaluation, item, note=f"not counted: {error.message}.")
    if between and isinstance(error, InvalidInput):
        # The annotation page shows its forms' 400s beside the form (static/feedback/refused.js).
        return HttpResponse(error.message, status=400, content_type="text/plain; charset=utf-8")
    return refused_as_text(request, error)


@login_required
@require_POST
@refusals(_vote_refused)
def vote_submit(request: HtmxHttpRequest, token: str, item: str) -> HttpResponse:
    evaluation = evaluation_by_token(token)
    if evaluation is None:
        raise Http404("no such evaluation")
    between = request.POST.get("shown_in") == "between"
    vote = vote_cast(evaluation=evaluation, token=item, voter=signed_in(request),
                     choice=request.POST.get("choice", ""), comment=request.POST.get("comment", ""))
    if between and request.htmx:
        return _between_done(request, evaluation, item, note="counted. Evaluation vote: not trained.",
                             choice=vote.choice)
    if not request.htmx:
        return redirect("evaluation:vote", token=token)
    evaluation.refresh_from_db()
    return render(request, "evaluation/_vote.html", _context(request, evaluation))


def _between_done(request: HtmxHttpRequest, evaluation: Evaluation, token: str, *, note: str,
                  choice: str = "") -> HttpResponse:
    """The finished card that replaces a pair's card on the annotation page (apps/evaluation/between.py)."""
    item = Item.objects.select_related("prompt", "left_answer", "right_answer").filter(
        evaluation=evaluation, token=token).first()
    if item is None:
        return refused_as_text(request, NotFound("no such pair in this evaluation", field="token"))
    shown = card(evaluation=evaluation, item=item, note=note, choice=choice)
    return render(request, shown.template, {"card": shown.context})
