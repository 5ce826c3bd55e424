"""Taking back one's own feedback while it can still change training: the annotation page's
undo of the last submission and the revisions of "my submissions".

Feedback is revisable while none of its targets has been claimed by a trainer (leased or
consumed) and it was not stored late. Withdrawing it refolds the group from the feedback
that remains (a group made trainable only by it goes back to waiting), and the author's
assignments on its targets open again so the items come back to their queue.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import TypedDict

from django.db import transaction
from django.db.models import Count, Q, QuerySet, Window
from django.utils import timezone

from apps.buffer.models import Experience
from apps.feedback.models import Assignment, Feedback, Person
from apps.feedback.kinds import feedback_votes, kind_get, kind_names
from apps.feedback.ledger import LabelState, label_states
from apps.feedback.raters.reliability import rater_offsets_cached, rater_weights_cached
from apps.feedback.handout.lease import lease_seconds_default
from apps.feedback.kinds.submit import FeedbackClosed
from apps.rewards.models import GoldItem
from apps.runs.events import event_publish
from kernel.fold import (
    experience_initial_fields,
    member_is_final,
    reward_combine,
    votes_fold,
)
from apps.runs.models import Run
from apps.runs.selectors import run_takes_feedback
from kernel.exceptions import InvalidInput

_TRAINED = (Experience.Status.LEASED, Experience.Status.CONSUMED)


class NotRevisable(InvalidInput):
    """The feedback is not the author's, or its group has been trained on."""

    code = "not_revisable"


def feedback_targets(fb: Feedback) -> list[int]:
    return kind_get(fb.kind).targets(fb)


def _gold_ids(run_id: int) -> set[int]:
    return set(GoldItem.objects.filter(run_id=run_id).values_list("experience_id", flat=True))


def _on_gold(fb: Feedback, gold: set[int]) -> bool:
    """Feedback on a gold item stays revisable like any fresh item's (its group is usually
    trained, and "trained on" beside it would announce it); withdrawing it changes no reward."""
    targets = feedback_targets(fb)
    return bool(targets) and all(t in gold for t in targets)


def run_takes_revisions(*, run: Run) -> bool:
    """A label is revised where a label may be given (apps.runs.selectors.run_takes_feedback,
    the one rule for stopped runs): a stopped, finished or failed run has settled what its
    labels did (a stopped or failed one may be started again, and takes new labels then)."""
    return run_takes_feedback(run=run)


class Submission(TypedDict):
    feedback: Feedback
    revisable: bool
    final: str  # why it can no longer change ("" while revisable)
    # Where the label stands (apps.feedback.ledger: the state every place shows; None for a
    # flag, which is no label) and the items it is on (its finished cards show the same state).
    state: LabelState | None
    targets: list[int]


def my_submissions(*, run: Run, author: Person, limit: int = 30) -> list[Submission]:
    """The author's latest feedback on the run, newest first, each with whether it may still
    be revised (and if not, why)."""
    return my_submissions_page(run=run, author=author, page=1, per_page=limit)["items"]


class SubmissionsPage(TypedDict):
    items: list[Submission]
    total: int  # the author's submissions on the run, all pages
    first: int  # the place of the first shown, 1 = the newest (0 when none)
    last: int  # the place of the last shown
    page: int  # 1 = the newest
    pages: int


def my_submissions_page(*, run: Run, author: Person, page: int, per_page: int) -> SubmissionsPage:
    """One page of the author's feedback on the run, newest first (issue 64 item 2: the list
    showed the latest 30 of 48, with nothing to reach the rest). A page past the last is the
    last."""
    rows = Feedback.objects.filter(run=run, author_id=author.pk, kind__in=kind_names(revisable=True))
    page = max(1, page)
    # The page and the total in one statement (a window count): the annotation page reads it on
    # every load (tests/test_door_costs.py).
    read, total = _page_rows(rows, page, per_page)
    total = total if read else (rows.count() if page > 1 else 0)
    pages = max(1, -(-total // per_page))
    if page > pages:  # past the last: the last
        page = pages
        read, _ = _page_rows(rows, page, per_page)
    start = (page - 1) * per_page
    items = _revisable(read, run)
    return {"items": items, "total": total, "first": start + 1 if items else 0, "last": start + len(items),
            "page": page, "pages": pages}


def _page_rows(rows: QuerySet[Feedback], page: int, per_page: int) -> tuple[list[Feedback], int]:
    """One page of `rows`, newest first, and how many there are on every page (0 when the page is empty)."""
    start = (page - 1) * per_page
    found = list(rows.annotate(total=Window(Count("id"))).order_by("-created_at", "-id")[start:start + per_page])
    read: list[Feedback] = [*found]
    return read, int(found[0].total) if found else 0


def _revisable(rows: list[Feedback], run: Run) -> list[Submission]:
    states = label_states(run=run, feedback=rows) if rows else {}

    def item(f: Feedback, revisable: bool, final: str) -> Submission:
        return {"feedback": f, "revisable": revisable, "final": final, "state": states.get(f.pk),
                "targets": feedback_targets(f)}

    if not run_takes_revisions(run=run):
        return [item(f, False, f"run {run.status}") for f in rows]
    trained = set(Experience.objects.filter(run=run, group_id__in={f.group_id for f in rows}, is_expert=False,
                                            status__in=_TRAINED).values_list("group_id", flat=True))
    gold = _gold_ids(run.pk)
    out: list[Submission] = []
    for f in rows:
        revisable = not f.late and (f.group_id not in trained or _on_gold(f, gold))
        out.append(item(f, revisable, "" if revisable else "final: its group was trained"))
    return out


def feedback_withdraw(*, run: Run, author: Person, feedback_id: int | None = None) -> Feedback:
    """Withdraw the author's feedback `feedback_id` (or their last revisable submission),
    refold its group and reopen their items. NotRevisable says why not; FeedbackClosed, on a
    run that takes no feedback, in the words a rating there gets."""
    if not run_takes_revisions(run=run):
        raise FeedbackClosed(run)  # the words a rating there is refused with
    with transaction.atomic():
        qs = Feedback.objects.select_for_update().filter(run=run, author_id=author.pk, kind__in=kind_names(revisable=True))
        if feedback_id is not None:
            fb = qs.filter(pk=feedback_id).first()
            if fb is None:
                raise NotRevisable("no such submission of yours on this run")
        else:
            fb = qs.order_by("-created_at", "-id").first()
            if fb is None:
                raise NotRevisable("nothing of yours to undo on this run")
        members = list(Experience.objects.select_for_update()
                       .filter(run=run, group_id=fb.group_id, is_expert=False).order_by("id"))
        if fb.late or (any(m.status in _TRAINED for m in members) and not _on_gold(fb, _gold_ids(run.pk))):
            raise NotRevisable("this group has been trained on: its feedback can no longer change")
        targets = feedback_targets(fb)
        fb.delete()
        group_refold(run=run, members=members)
        Assignment.objects.filter(run=run, annotator_id=author.pk, experience_id__in=targets,
                                  status=Assignment.Status.DONE).update(
            status=Assignment.Status.LEASED, finished_at=None,
            lease_expires_at=timezone.now() + timedelta(seconds=lease_seconds_default()))
        payload = {"id": feedback_id or fb.pk, "kind": fb.kind, "group_id": fb.group_id, "withdrawn": True,
                   "author": author.get_username(), "experience_id": fb.experience_id}
        transaction.on_commit(lambda: event_publish(run_id=run.pk, type="feedback.saved", payload=payload))
    return fb


def group_refold(*, run: Run, members: list[Experience]) -> None:
    """Human and final rewards of the open members from the feedback that remains (none the
    owner rejected); a group no longer complete waits for people again. Call inside a
    transaction with `members` locked (the withdrawal and the review do)."""
    feedback_cfg = run.cfg.feedback
    ids = [m.pk for m in members]
    group_ids = {m.group_id for m in members}
    on = Q(pk__in=[])
    for name in kind_names(folds=True):  # the kinds that fold, on a member or on its group
        on |= Q(kind=name, group_id__in=group_ids) if kind_get(name).target == "group" \
            else Q(kind=name, experience_id__in=ids)
    remaining = list(Feedback.objects.effective().filter(run=run, late=False).filter(on))
    # Weighted and offset per rater as group_fold does (apps.feedback.kinds.fold).
    folds = votes_fold(member_ids=ids, votes=feedback_votes(remaining), weights=rater_weights_cached(run=run),
                         offsets=rater_offsets_cached(run=run))
    complete = all(member_is_final(feedback_cfg=feedback_cfg, fold=folds[m.pk]) for m in members)
    for m in members:
        if m.status not in (Experience.Status.PENDING, Experience.Status.READY):
            continue
        human = folds[m.pk].human
        if human is None:
            changes: dict[str, object] = {"human_reward": None,
                                       "reward": experience_initial_fields(cfg=run.cfg, auto_reward=m.auto_reward).get("reward")}
        else:
            changes = {"human_reward": human}
            if feedback_cfg.mode != "auto":
                changes["reward"] = reward_combine(feedback_cfg=feedback_cfg, auto=m.auto_reward, human=human)
        if feedback_cfg.mode != "auto" and m.status == Experience.Status.READY and not complete:
            changes["status"] = Experience.Status.PENDING
        Experience.objects.filter(pk=m.pk).update(**changes)


class Revision(TypedDict):
    """What the revision form of one label shows (feedback/_revise.html): the label, and its
    kind's fields (`template`) pre-filled with its current value (`values`)."""
    feedback: Feedback
    template: str
    values: dict[str, object]


def revision_of(*, run: Run, author: Person, feedback_id: int) -> Revision:
    """The author's label `feedback_id` as its revision form shows it; NotRevisable (or
    FeedbackClosed) when it can no longer change, so the form never opens on one."""
    if not run_takes_revisions(run=run):
        raise FeedbackClosed(run)
    fb = Feedback.objects.filter(run=run, author_id=author.pk, kind__in=kind_names(revisable=True), pk=feedback_id).first()
    if fb is None:
        raise NotRevisable("no such submission of yours on this run")
    if not next(s for s in _revisable([fb], run) if s["feedback"] is fb)["revisable"]:
        raise NotRevisable("this group has been trained on: its feedback can no longer change")
    kind = kind_get(fb.kind)
    return {"feedback": fb, "template": kind.revision_template, "values": kind.revision_values(fb)}


def feedback_revise(*, run: Run, author: Person, feedback_id: int,
                    store: Callable[[], Feedback]) -> tuple[Feedback, Feedback]:
    """Replace the author's label `feedback_id` by what `store` saves (the kind's own service,
    given the revised form): one transaction, so a refused new value (InvalidInput) leaves the
    old label as it was. Returns the label replaced and the one that replaced it."""
    with transaction.atomic():
        old = feedback_withdraw(run=run, author=author, feedback_id=feedback_id)
        return old, store()
