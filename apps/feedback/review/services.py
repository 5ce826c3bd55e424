"""The owner's review of people's labels (issue 32 item 5, from Argilla / Label Studio): accept
or reject a label, and resolve a disagreement by accepting one side or giving one's own label.
The review page (apps.feedback.review.views) and the API (apps.feedback.review.api) call these.

A rejected label takes no effect from then on: it leaves the reward its group folds (the group
is refolded at once; one made trainable only by it waits for people again), the reward model's
preference pairs (what its trainer reads through apps.feedback.ports), DPO's choices and the
exports (all read `Feedback.objects.effective()`), and what its kind does besides (a rejected
correction's expert experience is filtered, apps.feedback.kinds.edit). A label whose group a
trainer already took (or which came late) cannot be taken back out of the versions trained on
it: the reward it taught stays there, and the outcome says so. Accepting records who and when;
accepting a rejected label puts it back. Every decision is an audit entry of the run.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from apps.buffer.models import Experience
from apps.feedback.kinds import kind_get
from apps.feedback.models import Assignment, Feedback
from apps.feedback.review.selectors import Disagreement, conflicts_among, disagreements
from apps.feedback.review.revise import group_refold
from apps.feedback.kinds.fold import group_fold
from apps.feedback.kinds.pairwise import feedback_compare
from apps.feedback.kinds.rating import feedback_rate
from apps.runs.events import labels_changed_publish
from apps.runs.models import AuditEntry, Run
from kernel.exceptions import Conflict, InvalidInput, NotFound

_TRAINED = (Experience.Status.LEASED, Experience.Status.CONSUMED)

Reviewer = User


@dataclass(frozen=True)
class ReviewOutcome:
    feedback: Feedback
    # What the decision did, in words (the page, the API and the audit log say it).
    effect: str
    # Its group was trained on before the decision: what it taught stays in those versions.
    trained: bool


def _effect(*, fb: Feedback, rejected: bool, changed: bool, trained: bool, extra: str) -> str:
    kind = kind_get(fb.kind)
    if not changed:
        return f"already {fb.review}"
    parts: list[str] = []
    if kind.folds:
        if trained:
            parts.append("its group was already trained on with this label in its reward: that reward stays in the "
                         "versions trained on it, and every later fold " + ("leaves it out" if rejected else "takes it"))
        else:
            parts.append("taken out of its group's reward" if rejected else "back in its group's reward")
    if kind.labels:
        parts.append("left out of the reward model's preference pairs and the exports" if rejected
                     else "back in the reward model's preference pairs and the exports")
    elif rejected:
        parts.append("no longer counted by the data pipeline or the exports")
    if extra:
        parts.append(extra)
    return "; ".join(parts)


def _decide(*, run: Run, feedback_id: int, reviewer: Reviewer, state: str) -> ReviewOutcome:
    with transaction.atomic():
        fb = (Feedback.objects.select_for_update(of=("self",)).filter(run=run, pk=feedback_id)
              .select_related("author").first())
        if fb is None:
            raise NotFound(f"feedback {feedback_id} is not feedback of run {run.pk}", field="feedback_id")
        kind = kind_get(fb.kind)
        if not kind.reviewable:
            raise InvalidInput(f"{kind.noun(2)} are not reviewed: they come from the environment, not from people",
                               field="feedback_id")
        was_rejected = fb.review == Feedback.Review.REJECTED
        rejected = state == Feedback.Review.REJECTED
        changed = fb.review != state
        members = list(Experience.objects.select_for_update().filter(run=run, group_id=fb.group_id, is_expert=False)
                       .order_by("id")) if fb.group_id else []
        trained = fb.late or any(m.status in _TRAINED for m in members)
        fb.review, fb.reviewed_by, fb.reviewed_at = state, reviewer, timezone.now()
        fb.save(update_fields=["review", "reviewed_by", "reviewed_at"])
        extra = ""
        if was_rejected != rejected:
            if kind.folds and not fb.late and members:
                # Both touch only the open members: a rejection refolds what remains (a group no
                # longer complete waits again), an acceptance folds it back in (and may complete it).
                if rejected:
                    group_refold(run=run, members=members)
                else:
                    group_fold(run=run, group_id=fb.group_id)
            extra = kind.reviewed(fb, rejected=rejected)
            if rejected and kind.folds and not trained and fb.author_id is not None and _slots_free(run=run, fb=fb):
                extra = "; ".join(p for p in (extra, "its items go back to the queue for someone else") if p)
        effect = _effect(fb=fb, rejected=rejected, changed=changed, trained=trained, extra=extra)
        if changed:
            labels_changed_publish(run_id=run.pk, why="reviewed")
            AuditEntry.objects.create(run=run, actor=reviewer, action=f"label_{'reject' if rejected else 'accept'}",
                                      detail={"feedback": fb.pk, "kind": fb.kind,
                                              "author": fb.author.get_username() if fb.author else None,
                                              "effect": effect[:1000]})
    return ReviewOutcome(feedback=fb, effect=effect, trained=trained)


def _slots_free(*, run: Run, fb: Feedback) -> int:
    """The rejected author's items of the label leave their done list (skipped: the slot frees
    for another annotator, and the item is not offered to them again)."""
    return Assignment.objects.filter(run=run, annotator_id=fb.author_id, experience_id__in=kind_get(fb.kind).targets(fb),
                                     status=Assignment.Status.DONE).update(status=Assignment.Status.SKIPPED)


def feedback_accept(*, run: Run, feedback_id: int, reviewer: Reviewer) -> ReviewOutcome:
    """Accept a label: recorded (who, when) and audited; a rejected one takes effect again."""
    return _decide(run=run, feedback_id=feedback_id, reviewer=reviewer, state=Feedback.Review.ACCEPTED)


def feedback_reject(*, run: Run, feedback_id: int, reviewer: Reviewer) -> ReviewOutcome:
    """Reject a label: it takes no effect from now on (module docstring)."""
    return _decide(run=run, feedback_id=feedback_id, reviewer=reviewer, state=Feedback.Review.REJECTED)


@dataclass(frozen=True)
class Resolution:
    kept: ReviewOutcome
    rejected: list[ReviewOutcome]


def _open_disagreement(*, run: Run, group_id: str) -> Disagreement:
    """The open disagreement on group `group_id` of `run`; the error a door answers otherwise."""
    if "\x00" in group_id or len(group_id) > 100:
        raise InvalidInput("a group id is at most 100 characters, none of them NUL", field="group_id")
    if not Experience.objects.filter(run=run, group_id=group_id).exists():
        raise NotFound(f"group {group_id!r} is not a group of run {run.pk}", field="group_id")
    found = disagreements(run=run, group_id=group_id)
    if not found:
        raise Conflict(f"no open disagreement on group {group_id!r}: it may have been resolved already",
                       field="group_id")
    return found[0]


def disagreement_resolve(*, run: Run, group_id: str, keep: int, reviewer: Reviewer) -> Resolution:
    """Resolve a disagreement by accepting one side: label `keep` is accepted and every label of
    the disagreement that conflicts with it is rejected."""
    disagreement = _open_disagreement(run=run, group_id=group_id)
    if keep not in {f.pk for f in disagreement.labels}:
        raise InvalidInput(f"feedback {keep} is not one of the labels in this disagreement", field="keep")
    against = sorted({c.second if c.first == keep else c.first for c in disagreement.conflicts
                      if keep in (c.first, c.second)})
    with transaction.atomic():
        kept = feedback_accept(run=run, feedback_id=keep, reviewer=reviewer)
        rejected = [feedback_reject(run=run, feedback_id=pk, reviewer=reviewer) for pk in against]
    return Resolution(kept=kept, rejected=rejected)


def disagreement_answer(
    *, run: Run, group_id: str, reviewer: Reviewer, experience_id: int | None = None, score: int | None = None,
    other_id: int | None = None, winner: str | None = None,
) -> Resolution:
    """Resolve a disagreement with the owner's own label: a rating (`experience_id`, `score`) or
    a choice (`experience_id` as A, `other_id` as B, `winner`), stored through its kind's service
    as anyone's is, accepted; the disagreement's labels that conflict with it are rejected."""
    disagreement = _open_disagreement(run=run, group_id=group_id)
    if experience_id is None:
        raise InvalidInput("name the completion your label is about", field="experience_id")
    if experience_id not in {e.pk for e in disagreement.experiences}:
        raise InvalidInput(f"experience {experience_id} is not one the disagreement is about", field="experience_id")
    with transaction.atomic():
        if other_id is not None or winner is not None:
            if other_id is None or not winner:
                raise InvalidInput("a choice names the other completion and the winner (a, b or tie)", field="winner")
            mine = feedback_compare(run=run, experience=experience_id, other=other_id, winner=winner, author=reviewer)
        else:
            if score is None:
                raise InvalidInput("give a score from 1 to 5", field="score")
            mine = feedback_rate(run=run, experience=experience_id, score=score, author=reviewer)
        kept = feedback_accept(run=run, feedback_id=mine.pk, reviewer=reviewer)
        rows = list(Feedback.objects.effective().filter(pk__in=[f.pk for f in disagreement.labels] + [mine.pk])
                    .select_related("author", "api_key"))
        exps = {e.pk: e for e in Experience.objects.filter(
            run=run, pk__in={i for f in rows for i in kind_get(f.kind).pair_ids(f)})}
        against = sorted({c.second if c.first == mine.pk else c.first for c in conflicts_among(rows, exps)
                          if mine.pk in (c.first, c.second)})
        rejected = [feedback_reject(run=run, feedback_id=pk, reviewer=reviewer) for pk in against]
    return Resolution(kept=kept, rejected=rejected)


__all__ = ["Resolution", "ReviewOutcome", "disagreement_answer", "disagreement_resolve", "feedback_accept",
           "feedback_reject"]
