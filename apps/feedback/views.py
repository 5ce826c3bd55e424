"""The annotation page and its HTMX partials. Thin: check the role, call a service, render.

Every partial is also reachable without JavaScript: a GET without HTMX renders the same
fragment inside the full page, and a form POST without HTMX redirects back to the page.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponse, HttpResponseForbidden
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils.safestring import mark_safe
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from apps.buffer.models import Experience
from apps.feedback.extras import not_trained, queue_entries
from apps.feedback.kinds import kind_get, kind_of_panel
from apps.feedback.kinds.flag import FLAGS
from apps.feedback.kinds.rating import score_from_form
from apps.feedback.ledger import LabelState, LedgerCounts, label_states, run_ledger
from apps.feedback.models import Assignment, Feedback, Person
from apps.feedback.rendering import markdown_safe
from apps.feedback.review.revise import (
    feedback_revise,
    feedback_targets,
    feedback_withdraw,
    my_submissions_page,
    revision_of,
)
from apps.feedback.handout.holds import holds_renew_when_due
from apps.feedback.handout.queue import annotation_queue, annotation_waiting, annotator_progress
from apps.feedback.selectors import feedback_counts, feedback_effect, late_words
from apps.feedback.handout.lease import assignment_claim, assignment_skip
from apps.feedback.kinds.rate_and_flag import feedback_rate_and_flag
from apps.runs.access import run_for_page
from apps.runs.models import Run
from apps.runs.selectors import run_feedback_closed_reason, run_feedback_closed_why, run_takes_feedback
from kernel.exceptions import InvalidInput, RftError
from rftweb.http import HtmxHttpRequest, fragment, refusals


def _queue_size() -> int:
    return settings.RFT_ANNOTATION_QUEUE_SIZE


def _refusal_as_text(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """The annotation page's script shows a refusal beside the item: a role short of giving
    feedback (run_for_page's PermissionDenied) answers 403 with its reason as plain text, and
    any other (an RftError the view or its services raise) 400 (`_error`, through rftweb.http's
    one translation of refusals)."""

    @functools.wraps(view)
    @refusals(_error)
    def wrapped(request: HtmxHttpRequest, *args: object, **kwargs: object) -> HttpResponse:
        try:
            return view(request, *args, **kwargs)
        except PermissionDenied as exc:
            return _forbidden(str(exc))

    return wrapped


def _forbidden(message: str) -> HttpResponse:
    return HttpResponseForbidden(message, content_type="text/plain; charset=utf-8")


def _error(request: HtmxHttpRequest, error: RftError, *args: object, **kwargs: object) -> HttpResponse:
    """The views' one translation of the error base: plain text naming the problem, 400
    (the page's script shows it beside the form, as text; without JS it is the page)."""
    return HttpResponse(error.message, status=400, content_type="text/plain; charset=utf-8")


def _page_url(run: Run) -> str:
    return reverse("feedback:page", kwargs={"run_id": run.pk})


def _fragment(request: HtmxHttpRequest, run: Run, template: str, context: dict[str, object]) -> HttpResponse:
    context = {"run": run, **context}
    # Without htmx the fragment is a page of its own: its forms and links swap into #panel,
    # the annotation page's box, so the page's one box takes that id unless it names another.
    return fragment(request, template, context if request.htmx else {"box": "panel", **context},
                    page="feedback/standalone.html")


def _item_context(run: Run, assignment: Assignment) -> dict[str, object]:
    return {"run": run, "a": assignment, "e": assignment.experience, "flags": FLAGS, "feedback_cfg": run.cfg.feedback}


@login_required
@require_GET
def annotate_page(request: HtmxHttpRequest, run_id: int) -> HttpResponse:
    run, role = run_for_page(user=request.user, run_id=run_id)
    # A finished or failed run lists nothing to do: the page says why and points at its summary.
    closed = not run_takes_feedback(run=run)
    can_annotate = role in ("owner", "annotator") and not closed
    if can_annotate:
        assignment_claim(run=run, annotator=request.user, size=_queue_size())
    queue = list(annotation_queue(run=run, annotator=request.user)) if can_annotate else []
    recent = [] if can_annotate or closed else list(Experience.objects.filter(run=run, is_expert=False).order_by("-id")[:20])
    feedback_cfg = run.cfg.feedback
    # Shown twice, counted once; the queue just read is the leased part of it.
    waiting = annotation_waiting(run=run, annotator=request.user, leased=len(queue)) if can_annotate else None
    return render(request, "feedback/annotate.html", {
        "run": run, "role": role, "can_annotate": can_annotate, "closed": closed, "queue": queue, "recent": recent,
        # Another app's cards between the items (apps/feedback/extras.py: blind votes).
        "entries": queue_entries(run=run, person=request.user, items=queue) if can_annotate else [],
        "closed_why": run_feedback_closed_why(run=run), "closed_reason": run_feedback_closed_reason(run=run),
        "feedback_cfg": feedback_cfg, "flags": FLAGS, **_counts_context(run, request.user, can_annotate, waiting=waiting),
        "ws_path": f"/ws/runs/{run.pk}/",
        # nh3-cleaned Markdown (apps.feedback.rendering), so safe to insert as HTML.
        "guidelines": mark_safe(markdown_safe(feedback_cfg.guidelines)) if feedback_cfg.guidelines.strip() else "",
        "progress": annotator_progress(run=run, annotator=request.user, waiting=waiting) if can_annotate else None,
        **_mine_in_box(run, request.user, can_annotate),
        # Where the person's labels and the run's went (apps/feedback/ledger.py): one statement,
        # counted in the database, however many labels the run has.
        **_ledger_context(run, request.user),
    })


def _mine_in_box(run: Run, person: Person, can_annotate: bool) -> dict[str, object]:
    if not can_annotate:
        return {"mine": []}
    listed = my_submissions_page(run=run, author=person, page=1, per_page=MINE_IN_BOX)
    # "not_trained" (the person's evaluation votes) comes with the ledger (_ledger_context), read once.
    return {"mine": listed["items"], "listed": listed}


def _ledger_context(run: Run, person: Person) -> dict[str, object]:
    ledger = run_ledger(run=run)
    # What else the person gave that trains nothing (evaluation votes: apps.feedback.extras).
    return {"run_ledger": ledger, "my_ledger": ledger.people.get(person.get_username(), LedgerCounts()),
            "not_trained": not_trained(run=run, person=person)}


@login_required
@require_GET
@_refusal_as_text
def ledger_partial(request: HtmxHttpRequest, run_id: int) -> HttpResponse:
    """The annotation page's "Where the labels went" (the person's labels and the run's), which
    the page asks for again on the events that move a label's state (feedback.saved,
    labels.changed, weights.synced, run.status): the same ledger as the page's."""
    run, _ = run_for_page(user=request.user, run_id=run_id)
    # On a page of its own, its box takes the id its refresh link swaps into.
    return _fragment(request, run, "feedback/_ledger_box.html",
                     {"box": "annotate-ledger", **_ledger_context(run, request.user)})


@login_required
@require_GET
@_refusal_as_text
def queue_partial(request: HtmxHttpRequest, run_id: int) -> HttpResponse:
    """New items for the live queue: tops the queue up and returns the items handed out
    after `after` (an assignment id), so the page appends only what it lacks."""
    run, _ = run_for_page(user=request.user, run_id=run_id, need="annotate")
    if not request.htmx and "after" not in request.GET:
        return redirect(_page_url(run))
    try:
        after = int(request.GET.get("after", "0") or 0)
    except ValueError:
        raise InvalidInput("after must be an assignment id", field="after") from None
    assignment_claim(run=run, annotator=request.user, size=_queue_size())
    items = [a for a in annotation_queue(run=run, annotator=request.user) if a.pk > after] if run_takes_feedback(run=run) else []
    return render(request, "feedback/_queue.html", {"run": run, "queue": items, "flags": FLAGS, "feedback_cfg": run.cfg.feedback,
                                                    "entries": queue_entries(run=run, person=request.user, items=items)})


@login_required
@require_GET
@_refusal_as_text
def counts_partial(request: HtmxHttpRequest, run_id: int) -> HttpResponse:
    """The annotation header's counts, live: the page polls it and asks again after each label
    (ratings, late labels, what waits for you: the one annotation_waiting). A poll is a sign of
    work: it renews the holds of the groups the annotator has open (apps.feedback.handout.holds), unless
    a renewal seconds ago (a label's) left nothing to renew."""
    run, role = run_for_page(user=request.user, run_id=run_id)
    can_annotate = role in ("owner", "annotator") and run_takes_feedback(run=run)
    # The renewal's read of the person's queue is the leased part of what waits for them.
    renewal = holds_renew_when_due(run=run, annotator=request.user) if can_annotate else None
    return _fragment(request, run, "feedback/_counts.html",
                     _counts_context(run, request.user, can_annotate, leased=renewal.leased if renewal else None))


def _counts_context(run: Run, user: Person, can_annotate: bool, *, waiting: int | None = None,
                    leased: int | None = None) -> dict[str, object]:
    if can_annotate and waiting is None:
        waiting = annotation_waiting(run=run, annotator=user, leased=leased)
    return {"counts": feedback_counts(run=run), "teaches": run.cfg.reward_model.enabled,
            "waiting": waiting if can_annotate else None}


def _my_assignment(request: HtmxHttpRequest, run_id: int, assignment_id: int) -> tuple[Run, Assignment]:
    """The run (the user may annotate it) and the user's own assignment in it, else 404."""
    run, _ = run_for_page(user=request.user, run_id=run_id, need="annotate")
    return run, get_object_or_404(Assignment.objects.select_related("experience"), pk=assignment_id, run=run,
                                  annotator=request.user)


def _item_done(request: HtmxHttpRequest, run: Run, a: Assignment, **note: object) -> HttpResponse:
    """After a rating or a skip: back to the page, or (htmx) the item as it now stands with `note`."""
    if not request.htmx:
        return redirect(_page_url(run))
    # The assignment and its experience as the label left them, in one read.
    a.refresh_from_db(from_queryset=Assignment.objects.select_related("experience"))
    return render(request, "feedback/_item_done.html", {**_item_context(run, a), **note})


def _saved_notes(run: Run, saved: list[Feedback]) -> list[tuple[Feedback, str, LabelState | None]]:
    """Each saved row, what it does (a late one's card says it still teaches the reward model),
    and where it stands (apps.feedback.ledger: a label's state, as "Your submissions", the
    header and the run page count it; None for a flag): issue 64 item 1, most cards said only
    "done · rating 3/5", and a late one what it may do but not where it stands."""
    states = label_states(run=run, feedback=saved)
    return [(f, feedback_effect(run=run, feedback=f), states.get(f.pk)) for f in saved]


@login_required
@require_POST
@_refusal_as_text
def rate(request: HtmxHttpRequest, run_id: int, assignment_id: int) -> HttpResponse:
    run, a = _my_assignment(request, run_id, assignment_id)
    score, thumb = score_from_form(request.POST)
    saved = feedback_rate_and_flag(run=run, author=request.user, experience=a.experience, score=score, thumb=thumb,
                          flags=request.POST.getlist("flags"), comment=request.POST.get("comment", ""))
    return _item_done(request, run, a, saved_notes=_saved_notes(run, saved))


@login_required
@require_POST
@_refusal_as_text
def skip(request: HtmxHttpRequest, run_id: int, assignment_id: int) -> HttpResponse:
    run, a = _my_assignment(request, run_id, assignment_id)
    assignment_skip(assignment=a)
    return _item_done(request, run, a, skipped=True)


def _experience(request: HtmxHttpRequest, run_id: int, experience_id: int) -> tuple[Run, Experience]:
    """The run (the user may annotate it) and one of its experiences, else 404."""
    run, _ = run_for_page(user=request.user, run_id=run_id, need="annotate")
    return run, get_object_or_404(Experience, pk=experience_id, run=run)


@login_required
@require_http_methods(["GET", "POST"])
@_refusal_as_text
def panel(request: HtmxHttpRequest, run_id: int, experience_id: int, slug: str) -> HttpResponse:
    """A kind's panel for one item (its `panel_template`, apps.feedback.kinds): GET shows it,
    POST stores what its form gives through the kind's `page_store`."""
    try:
        door = kind_of_panel(slug)
    except LookupError:
        raise Http404(f"no feedback kind has a panel at {slug!r}") from None
    run, e = _experience(request, run_id, experience_id)
    if request.method == "GET":
        return _fragment(request, run, door.panel_template,
                         {"e": e, **door.panel_context(run=run, experience=e, query=request.GET)})
    fb = door.page_store(request.POST, experience=e,
                         who={"run": run, "author": request.user, "comment": request.POST.get("comment", "")})
    if not request.htmx:
        return redirect(_page_url(run))
    saved = door.page_saved(run=run, feedback=fb)
    if door.late_note:
        saved["message"] = f"{saved['message']}{late_words(run=run, feedback=fb)}"
    return render(request, "feedback/_saved.html", {"run": run, "feedback": fb, **saved})


@login_required
@require_http_methods(["GET", "POST"])
@_refusal_as_text
def submissions(request: HtmxHttpRequest, run_id: int) -> HttpResponse:
    """GET: my submissions, newest first, a page at a time (`page`), each revisable while its
    group is untrained. POST: withdraw
    one (`feedback`), or the last one when none is named (undo); its items come back to the
    queue to be judged again."""
    run, _ = run_for_page(user=request.user, run_id=run_id, need="annotate")
    message = ""
    reopened: list[Assignment] = []
    on_queue_page = _asked_from(request, _page_url(run))
    if request.method == "POST":
        raw = request.POST.get("feedback", "").strip()
        if raw and not raw.isdigit():
            raise InvalidInput("must be the id of one of your submissions", field="feedback")
        # NotRevisable, or FeedbackClosed on a run that takes no labels: the 400 of `_error`.
        fb = feedback_withdraw(run=run, author=request.user, feedback_id=int(raw) if raw else None)
        message = f"Withdrawn: your {fb.kind} on #{fb.experience_id or fb.group_id}. Its item is back in your queue."
        if not request.htmx:
            return redirect(_page_url(run))
        # The reopened items replace their "done" cards in the annotation page's queue (out
        # of band); this list's own page has no queue, and links to it instead.
        if on_queue_page:
            reopened = list(Assignment.objects.filter(run=run, annotator_id=request.user.pk,
                                                      status=Assignment.Status.LEASED, experience_id__in=feedback_targets(fb))
                            .select_related("experience"))
    return _fragment(request, run, "feedback/_mine.html",
                     _mine_context(request, run, on_queue_page, _page_asked(request), message=message, reopened=reopened))


# The annotation page's box shows the latest few (its height stays bounded); the list's own
# page, more, a page at a time.
MINE_IN_BOX, MINE_PER_PAGE = 10, 30


def _mine_context(request: HtmxHttpRequest, run: Run, on_queue_page: bool, page: int = 1,
                  **shown: object) -> dict[str, object]:
    listed = my_submissions_page(run=run, author=request.user, page=1 if on_queue_page else page,
                                 per_page=MINE_IN_BOX if on_queue_page else MINE_PER_PAGE)
    # The list's own page refreshes the page it shows.
    here = f"{reverse('feedback:mine', kwargs={'run_id': run.pk})}?page={listed['page']}" if not on_queue_page else ""
    return {"run": run, "mine": listed["items"], "listed": listed, "own_page": not on_queue_page, "mine_here": here,
            "message": "", "reopened": [], "flags": FLAGS, "feedback_cfg": run.cfg.feedback,
            "queue_link": bool(shown.get("message")) and not on_queue_page, "box": "mine-box",
            "not_trained": not_trained(run=run, person=request.user), **shown}


def _page_asked(request: HtmxHttpRequest) -> int:
    raw = request.GET.get("page", "1").strip() or "1"
    if not raw.isdigit() or int(raw) < 1:
        raise InvalidInput(f"page is a page number from 1, got {raw!r}", field="page")
    return int(raw)


@login_required
@require_http_methods(["GET", "POST"])
@_refusal_as_text
def revise(request: HtmxHttpRequest, run_id: int, feedback_id: int) -> HttpResponse:
    """Revise one of my labels in place (issue 64 item 8). GET: its revision form, in place of
    its line in "your submissions", the current value pre-filled. POST: save it, replacing the
    label in one transaction (a refused value leaves the old one); the item's finished card on
    the annotation page shows the new value, where the page still has it."""
    run, _ = run_for_page(user=request.user, run_id=run_id, need="annotate")
    # Another run's label is out of reach: 404, as any object of a run not this one (another
    # person's label on this run: revision_of's 400, "no such submission of yours").
    get_object_or_404(Feedback, pk=feedback_id, run=run)
    revision = revision_of(run=run, author=request.user, feedback_id=feedback_id)
    if request.method == "GET":
        return _fragment(request, run, "feedback/_revise.html",
                         {"r": revision, "box": "mine-box", "standalone": not request.htmx})
    old = revision["feedback"]
    _, new = feedback_revise(run=run, author=request.user, feedback_id=old.pk,
                             store=lambda: _revised_store(request, run, old))
    if not request.htmx:
        return redirect(reverse("feedback:mine", kwargs={"run_id": run.pk}))
    on_queue_page = _asked_from(request, _page_url(run))
    cards = list(Assignment.objects.filter(run=run, annotator_id=request.user.pk, status=Assignment.Status.DONE,
                                           experience_id__in=feedback_targets(new)).select_related("experience")
                 ) if on_queue_page else []
    return _fragment(request, run, "feedback/_mine.html", _mine_context(
        request, run, on_queue_page, revised=new, revised_cards=cards,
        saved_notes=_saved_notes(run, [new])))


def _revised_store(request: HtmxHttpRequest, run: Run, old: Feedback) -> Feedback:
    """The revised label, stored by its kind from the revision form (the fields of the form it
    was given on: the card's, or the kind's panel's)."""
    # A group's label (a ranking) names no experience: its form reads the group from a member.
    experience = old.experience or Experience.objects.filter(run=run, group_id=old.group_id, is_expert=False).order_by("id").first()
    if experience is None:
        raise InvalidInput("the group of this label is gone", field="feedback")
    return kind_get(old.kind).revision_store(request.POST, experience=experience, who={
        "run": run, "author": request.user, "comment": request.POST.get("comment", "")})


def _asked_from(request: HtmxHttpRequest, url: str) -> bool:
    """Whether htmx sent the request from the page at `url` (its HX-Current-URL)."""
    return bool(request.htmx) and (request.htmx.current_url_abs_path or "").split("?")[0] == url
