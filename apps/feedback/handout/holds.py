"""Holds: a group a person has open waits for them rather than training under their hands.

An annotator's leased item on top of their queue (the first HOLDS_PER_PERSON open ones, in the
order they were handed out) holds its group: the item's assignment carries `held_until`, renewed
to `feedback.hold_seconds` from now on every sign of work (opening or polling the annotation
page, which claims; a label), and never past `feedback.hold_cap_seconds` after the item was
handed out. Every open member of the group carries the latest hold of any of its assignments
(`Experience.held_until`, in the buffer, which the trainer's claim reads:
apps.buffer.selectors.experiences_claimable skips a held group until the hold ends or its cap
passes). A finished or skipped item holds nothing; an abandoned one lapses within hold_seconds.

Under `auto` nothing is held (labels move no reward there), nor with hold_seconds 0. Under
`blend` and `human` the wait window (feedback.wait_seconds) ends as ever: a held group may
become ready, and is claimed once the hold is over, with what its people gave in the meantime
folded in. Under `learned`, until the reward model passes its gate, holds bound the window
itself (apps.feedback.handout.expiry.wait_window): a group nobody holds waits hold_seconds, a
held one stays pending while its hold lasts (never past wait_seconds).

The annotation header's counts renew through holds_renew_when_due: one that would move no hold
by more than RENEW_SLACK_SECONDS (the last sign of work was that recent: a label and the counts
the page asks for right after it, or the counts every page asks for after anyone's label)
reads the person's items once and writes nothing.

Renewals run after the label's transaction commits (`transaction.on_commit`): they touch other
groups' rows, which a fold of those groups may hold locked. A renewal that loses a race (a
deadlock) is dropped: the next sign of work renews again.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import DatabaseError, transaction
from django.db.models import Case, DateTimeField, ExpressionWrapper, F, Max, OuterRef, Q, Subquery, Value, When
from django.db.models.functions import Least
from django.utils import timezone

from apps.buffer.models import Experience
from apps.feedback.models import Assignment, Person
from apps.runs.models import Run

log = logging.getLogger(__name__)

_OPEN = (Experience.Status.PENDING, Experience.Status.READY)


# A run in one of these trains no more: nothing is held for anyone (holds_release on its end).
_ENDED = (Run.Status.FINISHED, Run.Status.FAILED, Run.Status.STOPPED)


def holds_apply(*, run: Run) -> bool:
    feedback_cfg = run.cfg.feedback
    return (feedback_cfg.mode != "auto" and feedback_cfg.hold_seconds > 0 and feedback_cfg.hold_cap_seconds > 0
            and run.status not in _ENDED)


# At most this much (and a tenth of hold_seconds) of a hold is given up to skip a renewal.
RENEW_SLACK_SECONDS = 5.0

# How many of a person's open items hold their groups: the first of their queue (the item they
# are on and the next). The page hands out a queue of RFT_ANNOTATION_QUEUE_SIZE items (8), and
# every one of them held its group while the page was open (the counts poll renews): one
# person held 8 groups of 8, a whole batch of 64, and two people held the demo's trainer for up
# to the cap ("waits for a full batch: 48 of 64" with 121 ready; issue 64 item 9). The rest of
# the queue holds nothing: a label on an item whose group trained meanwhile is late (it still
# teaches the reward model).
HOLDS_PER_PERSON = 2


def _on_top(rows: Iterable[tuple[int, str]]) -> set[int]:
    """The ids of the open items that hold, of a person's (assignment id, experience status)."""
    return set(sorted(pk for pk, status in rows if status in _OPEN)[:HOLDS_PER_PERSON])


def holds_renew(*, run: Run, annotator: Person, also_groups: Iterable[str] = ()) -> int:
    """Renew the holds of `annotator`'s leased items on `run` (a sign of work), and bring the
    holds of their groups (and of `also_groups`: those of items they just finished or skipped)
    up to date. Returns the number of groups held for them now."""
    if not holds_apply(run=run) or not getattr(annotator, "is_authenticated", False):
        return 0
    feedback_cfg = run.cfg.feedback
    now = timezone.now()
    try:
        with transaction.atomic():
            _lock_or_yield(run=run, annotator=annotator, also_groups=also_groups)
            mine = Assignment.objects.filter(run=run, annotator_id=annotator.pk, status=Assignment.Status.LEASED,
                                             experience__status__in=_OPEN)
            cap = ExpressionWrapper(F("created_at") + timedelta(seconds=feedback_cfg.hold_cap_seconds),
                                    output_field=DateTimeField())
            # One statement: the items on top (_on_top's rule, as a subquery) hold, the rest not.
            on_top = mine.order_by("id").values("pk")[:HOLDS_PER_PERSON]
            mine.update(held_until=Case(
                When(pk__in=Subquery(on_top), then=Least(Value(now + timedelta(seconds=feedback_cfg.hold_seconds)), cap)),
                default=Value(None), output_field=DateTimeField()))
            # One read of their leased items for both: the open ones' groups to bring up to date,
            # and the groups a live hold keeps for them (the counts poll runs this every 10 s).
            leased = Assignment.objects.filter(run=run, annotator_id=annotator.pk, status=Assignment.Status.LEASED
                                               ).values_list("experience__group_id", "experience__status", "held_until")
            groups, held = set(also_groups), set()
            for group, status, until in leased:
                if status in _OPEN:
                    groups.add(group)
                if until is not None and until > now:
                    held.add(group)
            held_groups = len(held)
            holds_sync(run=run, group_ids=groups, now=now)
    except DatabaseError:
        log.info("hold renewal of run %s for %s lost a race; the next sign of work renews it", run.pk, annotator.pk)
        return 0
    return held_groups


@dataclass(frozen=True)
class Renewal:
    """What holds_renew_when_due found: the person's leased items on the run (their queue, as
    read: the caller's count of them), and the groups held for them now."""

    leased: int
    held: int


def holds_renew_when_due(*, run: Run, annotator: Person) -> Renewal | None:
    """holds_renew for a sign of work that may come seconds after the last (the annotation
    header's counts: every 10 s, after each of the person's labels, and after anyone's label
    on the run): when no hold would move by more than RENEW_SLACK_SECONDS, one read of the
    person's items and no write, no lock. None where nothing is held (nothing read)."""
    if not holds_apply(run=run) or not getattr(annotator, "is_authenticated", False):
        return None
    now = timezone.now()
    feedback_cfg = run.cfg.feedback
    slack = min(RENEW_SLACK_SECONDS, feedback_cfg.hold_seconds / 10)
    soonest = now + timedelta(seconds=feedback_cfg.hold_seconds - slack)
    cap = timedelta(seconds=feedback_cfg.hold_cap_seconds)
    rows = list(Assignment.objects.filter(run=run, annotator_id=annotator.pk, status=Assignment.Status.LEASED)
                .values_list("pk", "experience__group_id", "experience__status", "held_until", "created_at"))
    on_top = _on_top((pk, status) for pk, _, status, _, _ in rows)
    # Due: an item on top whose hold would lapse soon, or one below it still holding (the top moved).
    if any((pk in on_top and (until is None or until < min(soonest, handed + cap)))
           or (pk not in on_top and status in _OPEN and until is not None) for pk, _, status, until, handed in rows):
        return Renewal(leased=len(rows), held=holds_renew(run=run, annotator=annotator))
    return Renewal(leased=len(rows), held=len({group for _, group, _, until, _ in rows if until is not None and until > now}))


def _lock_or_yield(*, run: Run, annotator: Person, also_groups: Iterable[str]) -> None:
    """Lock the rows a renewal writes, in a label's order (its group's experiences, then the
    assignments), without waiting: a label being folded holds them, and a renewal that waited
    for them while holding the assignments deadlocked with it, and Postgres could end the
    label's transaction (a 503 while someone labelled quickly). Raises DatabaseError when a row
    is taken; the renewal gives way (the next sign of work renews)."""
    leased = Assignment.objects.filter(run=run, annotator_id=annotator.pk, status=Assignment.Status.LEASED)
    groups = Q(group_id__in=leased.values("experience__group_id")) | Q(group_id__in=list(also_groups))
    list(Experience.objects.select_for_update(nowait=True).filter(groups, run=run, status__in=_OPEN)
         .order_by("id").values_list("pk", flat=True))
    list(leased.select_for_update(nowait=True).order_by("id").values_list("pk", flat=True))


def holds_sync(*, run: Run, group_ids: Iterable[str], now: datetime | None = None) -> int:
    """Every open member of these groups carries the latest live hold among the group's leased
    items (none when no hold is live). Returns the rows updated."""
    groups = sorted(set(group_ids))
    if not groups:
        return 0
    now = now or timezone.now()
    latest = (Assignment.objects.filter(run=run, status=Assignment.Status.LEASED, held_until__gt=now,
                                        experience__group_id=OuterRef("group_id"))
              .values("experience__group_id").annotate(latest=Max("held_until")).values("latest")[:1])
    return Experience.objects.filter(run=run, group_id__in=groups, status__in=_OPEN).update(
        held_until=Subquery(latest, output_field=DateTimeField()))


def holds_renew_on_commit(*, run: Run, annotator: Person, also_groups: Iterable[str] = ()) -> None:
    """holds_renew once the caller's transaction commits (see the module docstring)."""
    groups = list(also_groups)
    transaction.on_commit(lambda: holds_renew(run=run, annotator=annotator, also_groups=groups))


def holds_release(*, run_id: int) -> int:
    """Release every hold of the run (it ended: nothing trains any more, so no group waits for
    anyone). Labels given on those groups read "unused: the run ended" in the ledger
    (apps.feedback.ledger), or why the reward model made no pair of them where a version
    recorded one; no last step trains them. Returns the experiences released."""
    Assignment.objects.filter(run_id=run_id, held_until__isnull=False).update(held_until=None)
    return Experience.objects.filter(run_id=run_id, held_until__isnull=False).update(held_until=None)


@dataclass(frozen=True)
class HeldForPeople:
    """Groups ready to train that wait for people who have them open (what the run page says
    when training waits on them)."""

    groups: int
    experiences: int
    people: dict[str, int]  # username -> groups held for them
    since: datetime  # the first hand-out of an item that holds one
    ends: datetime  # when the last hold ends if nobody works on them
    latest: datetime  # when the last ends however they work (the holds' caps)


def held_for_people(*, run: Run, now: datetime | None = None) -> HeldForPeople | None:
    """The run's ready groups held for people now, who holds them and until when; None when none."""
    now = now or timezone.now()
    groups = set(Experience.objects.filter(run=run, status=Experience.Status.READY, is_expert=False,
                                           held_until__gt=now).values_list("group_id", flat=True))
    if not groups:
        return None
    experiences = Experience.objects.filter(run=run, status=Experience.Status.READY, is_expert=False,
                                            group_id__in=groups).count()
    rows = list(Assignment.objects.filter(run=run, status=Assignment.Status.LEASED, held_until__gt=now,
                                          experience__group_id__in=groups)
                .values_list("annotator__username", "experience__group_id", "held_until", "created_at"))
    cap = timedelta(seconds=run.cfg.feedback.hold_cap_seconds)
    people: dict[str, set[str]] = {}
    for who, group, _, _ in rows:
        people.setdefault(who, set()).add(group)
    return HeldForPeople(
        groups=len(groups), experiences=experiences, people={who: len(g) for who, g in sorted(people.items())},
        since=min((handed for _, _, _, handed in rows), default=now),
        ends=max((until for _, _, until, _ in rows if until is not None), default=now),
        latest=max((handed + cap for _, _, _, handed in rows), default=now))
