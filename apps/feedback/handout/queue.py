"""The annotation queue as it stands: the items leased to a person (`annotation_queue`), the
one count of what waits for them (`annotation_waiting`: their queue plus what the hand-out's
rule would still give them, apps.feedback.handout.rule), the run's labelling job and a
person's day, and which hand-outs the reward model did not choose."""

from __future__ import annotations

from typing import TypedDict

from django.db.models import Case, Count, IntegerField, Q, QuerySet, Value, When

from apps.buffer.models import Experience
from apps.feedback.models import Assignment, Feedback, Person
from apps.feedback.handout.rule import annotation_handout
from apps.feedback.kinds import kind_names
from apps.runs.models import Run, RunMember
from apps.runs.selectors import run_takes_feedback

_OPEN = (Experience.Status.PENDING, Experience.Status.READY)
_LIVE = (Assignment.Status.LEASED, Assignment.Status.DONE)


def queue_item_counts() -> Q:
    """A leased item whose label can still change its group's reward: its completion is still
    open (pending or ready), or it is a gold item (handed out on purpose, trained or not, and
    never to be told apart from the rest)."""
    return Q(experience__status__in=_OPEN) | Q(source=Assignment.Source.GOLD)


def annotation_queue(*, run: Run, annotator: Person) -> QuerySet[Assignment]:
    """The annotator's leased items in the order they were handed out, those whose group
    trained meanwhile (a label on them is late: it only teaches the reward model) after the
    rest: a page loaded late serves what a label can still change first."""
    stale = Case(When(queue_item_counts(), then=Value(0)), default=Value(1), output_field=IntegerField())
    return (
        Assignment.objects.filter(run=run, annotator_id=annotator.pk, status=Assignment.Status.LEASED)
        .select_related("experience")
        .order_by(stale, "id")
    )


# Hand-outs the reward model did not choose: the selection rule's random share, and arrival
# order (no rule). Labels of items handed out only so are an unbiased sample of the run's items.
UNBIASED_SOURCES = (Assignment.Source.RANDOM, Assignment.Source.ARRIVAL)


def experiences_handed_out_unbiased(*, run: Run) -> set[int]:
    """Experiences every hand-out of which (skipped ones too) came from the random share or
    arrival order. One the rule, a gold turn or an unrecorded hand-out also gave out is left
    out, and so is one never handed out (rated through the API: someone chose it)."""
    chosen = Assignment.objects.filter(run=run).exclude(source__in=UNBIASED_SOURCES).values("experience_id")
    return set(Assignment.objects.filter(run=run, source__in=UNBIASED_SOURCES).exclude(experience_id__in=chosen)
               .values_list("experience_id", flat=True).distinct())


def annotation_waiting(*, run: Run, annotator: Person, leased: int | None = None) -> int:
    """The one count of what waits for `annotator` on the run, shown on every page (the runs
    list, the run page, the annotation page) and by the API: the items in their queue (leased
    to them) plus what the queue's claim would still hand them (annotation_handout: the claim's
    own definition). A claim moves items from the second part to the first, so opening the
    annotation page does not change it; a label, a skip, or an item that trained or went to
    someone else does. 0 on a run that takes no more feedback. `leased`: the items in their
    queue, where the caller has read them (the annotation page lists them)."""
    if not run_takes_feedback(run=run):
        return 0
    if leased is None:
        leased = Assignment.objects.filter(run=run, annotator_id=annotator.pk, status=Assignment.Status.LEASED).count()
    return leased + annotation_handout(run=run, annotator=annotator).count()


class PersonLabelling(TypedDict):
    username: str
    labels: int  # judgements given (the label kinds), late ones included
    late: int  # of those, given after their group trained
    skipped: int  # items they passed on
    leased: int  # items in their queue now


class LabellingProgress(TypedDict):
    done: int  # overlap slots labelled through the queue
    remaining: int  # slots a label can still fill: in someone's queue, or free on open items
    leased: int  # of the remaining, in someone's queue now
    percent: int  # done of done + remaining
    open: bool  # the run still takes feedback (an ended run has nothing remaining)
    people: list[PersonLabelling]


def labelling_progress(*, run: Run) -> LabellingProgress:
    """The whole labelling job of the run, as its owner follows it: overlap slots labelled and
    still to label (the same slots annotation_waiting counts per person), and per person the
    labels given, late and skipped. Everyone who may annotate is listed, with zeros until
    they start."""
    done = Assignment.objects.filter(run=run, status=Assignment.Status.DONE).count()
    leased = remaining = 0
    if run_takes_feedback(run=run):
        leased = Assignment.objects.filter(queue_item_counts(), run=run, status=Assignment.Status.LEASED).count()
        open_items = Experience.objects.filter(run=run, is_expert=False, status__in=_OPEN)
        held = Assignment.objects.filter(experience__in=open_items, status__in=_LIVE).count()
        remaining = leased + max(0, run.cfg.feedback.overlap * open_items.count() - held)
    people: dict[int, PersonLabelling] = {}

    def person(user_id: int, username: str) -> PersonLabelling:
        return people.setdefault(user_id, {"username": username, "labels": 0, "late": 0, "skipped": 0, "leased": 0})

    for member in RunMember.objects.filter(run=run, role=RunMember.Role.ANNOTATOR).select_related("user"):
        person(member.user_id, member.user.get_username())
    for row in (Feedback.objects.filter(run=run, kind__in=kind_names(labels=True), author__isnull=False).order_by()
                .values("author_id", "author__username")
                .annotate(n=Count("id"), n_late=Count("id", filter=Q(late=True)))):
        entry = person(row["author_id"], row["author__username"])
        entry["labels"], entry["late"] = row["n"], row["n_late"]
    takes = run_takes_feedback(run=run)
    for queued in (Assignment.objects.filter(run=run).order_by().values("annotator_id", "annotator__username")
                .annotate(n_skipped=Count("id", filter=Q(status=Assignment.Status.SKIPPED)),
                          n_leased=Count("id", filter=Q(status=Assignment.Status.LEASED)))):
        entry = person(queued["annotator_id"], queued["annotator__username"])
        # An ended run's queues hand nothing out (annotation_waiting is 0 there): nothing is
        # in anyone's queue, whatever leases its last hand-out left (issue 64 item 1: "In
        # queue 18" after the run finished).
        entry["skipped"], entry["leased"] = queued["n_skipped"], queued["n_leased"] if takes else 0
    total = done + remaining
    return {
        "done": done, "remaining": remaining, "leased": leased,
        "percent": round(100 * done / total) if total else (100 if done else 0),
        "open": takes,
        "people": sorted(people.values(), key=lambda p: (-p["labels"], p["username"])),
    }


def annotator_progress(*, run: Run, annotator: Person, waiting: int | None = None) -> dict[str, int]:
    """The annotator's day on the run: judgements given today (local day), what waits for
    them (annotation_waiting: `waiting`, where the caller has counted it), and the owner's
    daily target (0: none)."""
    from django.utils import timezone

    start = timezone.localtime().replace(hour=0, minute=0, second=0, microsecond=0)
    done = Feedback.objects.filter(run=run, author_id=annotator.pk, created_at__gte=start,
                                   kind__in=kind_names(labels=True)).count()
    return {"done_today": done,
            "waiting": annotation_waiting(run=run, annotator=annotator) if waiting is None else waiting,
            "target": run.cfg.feedback.daily_target}
