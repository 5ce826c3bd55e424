"""Submitting feedback: what every kind's service shares. Each kind's service lives in the
kind's own module (apps.feedback.kinds); the annotation page, the environment API and the CLI
all call those. A service builds its value in the kind's one shape (its typed model), decides
lateness by the one rule (kernel.fold.feedback_is_late), stores the row (`feedback_row_create`),
folds it into the group when it bears on rewards, and announces `feedback.saved`.

Every piece of feedback is stored as its own row, whatever happens to its target. Feedback
whose target was already taken by the trainer (leased or consumed) or dropped is stored
with late=True, counted, and left out of the fold: the reward the trainer saw stays the
reward the buffer shows, and the late rows stay available to DPO, SFT and export.
"""

from __future__ import annotations

from collections.abc import Sequence

from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import Model

from apps.buffer.models import Experience
from apps.feedback.models import Feedback, Person
from apps.feedback.kinds import KindValue, kind_get
from apps.feedback.kinds.fold import FoldResult, group_fold, group_members_locked
from apps.feedback.handout.lease import assignments_finish
from apps.rewards.models import GoldItem
from apps.runs.events import event_publish
from kernel.fold import feedback_is_late
from apps.runs.models import Run
from apps.runs.selectors import run_feedback_closed_why, run_takes_feedback
from kernel.exceptions import Conflict, InvalidInput, NotFound

# The environment API's key that sent the feedback (an envapi.ApiKey row, Feedback.api_key's
# FK): the envapi app sits above this one (pyproject.toml's layers), so its model is not
# imported here: a row is all this app needs of it.
ApiKeyRow = Model


class FeedbackClosed(Conflict):
    """Feedback on a run that takes none (a 409): a twin, its run without people by
    construction, or a finished, failed or stopped run, where nothing it could change is left.
    A withdrawal there is refused with the same words (apps.feedback.review.revise)."""

    code = "feedback_closed"

    def __init__(self, run: Run) -> None:
        super().__init__(run_feedback_closed_why(run=run), field="run")


def comment_clean(comment: str | None) -> str:
    comment = (comment or "").strip()
    if len(comment) > 5000:
        raise InvalidInput("a comment is at most 5000 characters", field="comment")
    return comment


def experience_of_run(*, run: Run, experience: Experience | int | None, what: str) -> Experience:
    """The run's experience `experience` (a row or an id); the input field `what` is named when
    it is missing (InvalidInput) or not the run's (NotFound)."""
    if experience is None:
        raise InvalidInput(f"{what} is required", field=what)
    pk = experience.pk if isinstance(experience, Experience) else experience
    found = Experience.objects.filter(run=run, pk=pk).first()
    if found is None:
        raise NotFound(f"experience {pk} is not an experience of run {run.pk}", field=what)
    return found


def person_of(author: Person | None) -> User | None:
    """The signed-in person behind `author`, None for an anonymous one or none."""
    return author if isinstance(author, User) and author.is_authenticated else None


def feedback_row_create(
    *, run: Run, kind: str, value: KindValue, targets: Sequence[Experience], group_id: str,
    author: User | None, api_key: ApiKeyRow | None, comment: str, other: Experience | None = None,
) -> Feedback:
    """The row itself, late or not by the one rule. Call inside a transaction, with the
    targets' group locked. A run that takes no more feedback (finished, failed) refuses it,
    whichever door it came through."""
    if not run_takes_feedback(run=run):
        raise FeedbackClosed(run)
    late = feedback_is_late(statuses=[t.status for t in targets])
    if late and _gold_targets(run=run, targets=targets):
        # A gold item is usually a trained-on completion handed out on purpose: its answer is
        # no late feedback (and nothing in the page may say "late" about it). It is still never
        # folded into a trained reward: group_fold only touches open members.
        late = False
    return Feedback.objects.create(
        run=run, kind=kind, experience=targets[0] if kind_get(kind).target != "group" else None, other=other,
        group_id=group_id, author=author, api_key_id=api_key.pk if api_key is not None else None,
        value=value.stored(), comment=comment, late=late,
    )


def _gold_targets(*, run: Run, targets: Sequence[Experience]) -> bool:
    return GoldItem.objects.filter(run=run, experience_id__in=[t.pk for t in targets]).exists()


def feedback_announce(*, run: Run, feedback: Feedback, ready: bool) -> None:
    """`feedback.saved` on the run's live events, once the transaction commits."""
    payload = {
        "id": feedback.pk,
        "kind": feedback.kind,
        "experience_id": feedback.experience_id,
        "other_id": feedback.other_id,
        "group_id": feedback.group_id,
        "late": feedback.late,
        "author": feedback.author.get_username() if feedback.author else None,
        "source": "env" if feedback.api_key_id else "human",
        "group_ready": ready,
    }
    transaction.on_commit(lambda: event_publish(run_id=run.pk, type="feedback.saved", payload=payload))


def feedback_fold_and_finish(*, run: Run, feedback: Feedback, members: list[Experience],
                             targets: Sequence[int]) -> Feedback:
    """After a row that folds: fold its group (unless late), close the author's leases of
    `targets` and announce it."""
    fold = FoldResult(updated=0, became_ready=False)
    if not feedback.late:
        fold = group_fold(run=run, group_id=feedback.group_id, members=members)
    assignments_finish(run=run, annotator=feedback.author, experience_ids=targets, group_id=feedback.group_id)
    feedback_announce(run=run, feedback=feedback, ready=fold.became_ready)
    return feedback


def feedback_store(
    *, run: Run, kind: str, value: KindValue, experience: Experience | int | None, author: Person | None = None,
    api_key: ApiKeyRow | None = None, comment: str = "",
) -> Feedback:
    """The shared service of a kind that targets one experience (ratings; a kind of one's
    own, registered in apps.feedback.kinds): store `value` (its kind's typed model, checked
    when built) by the one lateness rule, fold it into its group's rewards when the kind
    folds (unless late), close the author's assignment of the item and announce it."""
    folds = kind_get(kind).folds
    comment, author = comment_clean(comment), person_of(author)
    with transaction.atomic():
        # A row the caller read from this run (the page's assignment) gives its group; the
        # group's locked read below is then the one read of it (an expert experience, in no
        # group's members, or one gone meanwhile is read, or refused, by experience_of_run).
        given = experience if isinstance(experience, Experience) and experience.run_id == run.pk else None
        target = given or experience_of_run(run=run, experience=experience, what="experience_id")
        members = group_members_locked(run=run, group_id=target.group_id)
        locked = next((m for m in members if m.pk == target.pk), None)
        if locked is None and given is not None:  # not read yet: an expert experience, or gone
            locked = experience_of_run(run=run, experience=target.pk, what="experience_id")
        target = locked or target
        fb = feedback_row_create(run=run, kind=kind, value=value, targets=[target], group_id=target.group_id,
                                 author=author, api_key=api_key, comment=comment)
        if folds:
            return feedback_fold_and_finish(run=run, feedback=fb, members=members, targets=[target.pk])
        assignments_finish(run=run, annotator=fb.author, experience_ids=[target.pk], group_id=target.group_id)
        feedback_announce(run=run, feedback=fb, ready=False)
        return fb
