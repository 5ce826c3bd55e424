"""The hand-out: the annotation queue's assignments, leased under the run's overlap (one live
assignment a slot), in arrival order or by the run's selection rule, with gold items and
trust-aware shares (`feedback.trust`); skips, and the leases a label closes."""

from __future__ import annotations

import hashlib
import logging
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth.models import User
from django.db import OperationalError, connection
from django.utils import timezone
from psycopg.errors import DeadlockDetected

from apps.feedback.handout.holds import holds_renew, holds_renew_on_commit
from apps.feedback.models import Assignment, Person
from apps.feedback.handout.rule import WINDOW, selection_order, selection_ranks, share_slots
from apps.feedback.handout.rule import Handout, annotation_handout, handout_selects
from apps.feedback.handout.queue import queue_item_counts
from apps.runs.models import Run, RunMember
from apps.runs.selectors import run_takes_feedback

_LIVE = (Assignment.Status.LEASED, Assignment.Status.DONE)
logger = logging.getLogger(__name__)


def lease_seconds_default() -> float:
    """How long an item stays leased to its annotator unless the claim says otherwise."""
    return settings.RFT_ANNOTATION_LEASE_SECONDS


def assignment_reap(*, run: Run | None = None, now: datetime | None = None) -> int:
    """Abandoned items go back: delete leased assignments whose lease has expired, which
    frees their slot for the next claimer."""
    qs = Assignment.objects.filter(status=Assignment.Status.LEASED, lease_expires_at__lt=now or timezone.now())
    if run is not None:
        qs = qs.filter(run=run)
    deleted, _ = qs.delete()
    return deleted


def assignment_claim(*, run: Run, annotator: Person, size: int = 5, lease_seconds: float | None = None) -> list[Assignment]:
    """Top the annotator's queue up to `size` leased items; returns the new assignments.
    A claim is a sign of work (the page opened or polled): it renews the holds of the groups
    the annotator has open (apps.feedback.handout.holds).

    What a label can still change comes first (apps.feedback.handout.rule.annotation_candidates:
    groups waiting for people, the freshest first, then the selection rule). An
    experience is handed to at most `run.cfg.feedback.overlap` annotators at once (leased
    or done): the unique live slot makes concurrent claimers lose cleanly instead of
    overshooting.
    """
    if size < 1:
        raise ValueError("size must be at least 1")
    if not run_takes_feedback(run=run) or not isinstance(annotator, User):
        return []  # a finished or failed run hands nothing out; the views ask signed in
    created = _claim(run=run, annotator=annotator, size=size, lease_seconds=lease_seconds)
    holds_renew(run=run, annotator=annotator)
    return created


def _claim(*, run: Run, annotator: User, size: int, lease_seconds: float | None) -> list[Assignment]:
    assignment_reap(run=run)
    # Items whose group trained while they sat in the queue do not fill it: fresh ones come
    # beside them (the queue shows them first, apps.feedback.handout.queue.annotation_queue).
    want = size - Assignment.objects.filter(run=run, annotator=annotator, status=Assignment.Status.LEASED).filter(
        queue_item_counts()).count()
    if want <= 0:
        return []
    overlap = run.cfg.feedback.overlap
    expires = timezone.now() + timedelta(seconds=lease_seconds if lease_seconds is not None else lease_seconds_default())
    # What it may hand out: the definition annotation_waiting counts too.
    handout = annotation_handout(run=run, annotator=annotator)
    candidates = handout.fresh
    created: list[Assignment] = []

    if handout_selects(run.cfg.feedback):
        return _claim_selected(run=run, annotator=annotator, handout=handout, want=want, expires=expires)
    tried: set[int] = set()
    for _ in range(8):  # windows; each one either yields items or shows the pool is empty
        window = [pk for pk in candidates.exclude(pk__in=tried).values_list("pk", flat=True)[: want * 3 + 8]]
        if not window:
            break
        tried.update(window)
        free = slots_free(dict.fromkeys(window, range(overlap)))
        created += slots_take(run=run, annotator=annotator, want=want - len(created), expires=expires,
                               offers=[(exp_id, free[exp_id], Assignment.Source.ARRIVAL) for exp_id in window])
        if len(created) >= want:
            return created
    return created


def slots_take(*, run: Run, annotator: User, offers: Sequence[tuple[int, Sequence[int], str]], want: int,
                expires: datetime) -> list[Assignment]:
    """Lease up to `want` of `offers` (an experience id, its free slots and the hand-out's
    source, in the order offered) in one INSERT ... ON CONFLICT DO NOTHING a round, not a
    savepoint and an insert per item (a page load handed out 8 items in 24 statements, 16
    under a selection rule in 94). A slot a parallel claimer took in between is skipped by
    the conflict; its item tries its next free slot in the next round, after the items not
    yet offered have had theirs. Returns the leases in the order offered."""
    created: dict[int, Assignment] = {}
    pending = [(exp_id, list(slots), source) for exp_id, slots, source in offers if slots]
    while pending and len(created) < want:
        batch, pending = pending[:want - len(created)], pending[want - len(created):]
        _insert_retrying_deadlocks([
            Assignment(run=run, experience_id=exp_id, annotator=annotator, slot=slots[0], lease_expires_at=expires,
                       source=source) for exp_id, slots, source in batch])
        # ON CONFLICT DO NOTHING returns no ids: this claim's rows are the ones with its lease.
        created.update((a.experience_id, a) for a in Assignment.objects.filter(
            run=run, annotator=annotator, experience_id__in=[exp_id for exp_id, _, _ in batch],
            status=Assignment.Status.LEASED, lease_expires_at=expires))
        lost = [exp_id for exp_id, slots, _ in batch if exp_id not in created and len(slots) > 1]
        if lost:
            # An item this annotator got meanwhile (a parallel request of theirs) conflicts on
            # every slot: only the others try their next one.
            theirs = set(Assignment.objects.filter(annotator=annotator, experience_id__in=lost)
                         .values_list("experience_id", flat=True))
            pending += [(exp_id, slots[1:], source) for exp_id, slots, source in batch
                        if exp_id in lost and exp_id not in theirs]
    return [created[exp_id] for exp_id, _, _ in offers if exp_id in created]


def _insert_retrying_deadlocks(rows: list[Assignment], *, tries: int = 5) -> None:
    """INSERT ... ON CONFLICT DO NOTHING, in the order given: the rows' ids are the queue's
    order (the rule's ranking), so they cannot go in sorted. Two claimers inserting the same
    items in their own ranked orders can each wait on a row the other just wrote; Postgres
    then ends one statement with a deadlock (CI, stop 68: a person's claim raised). Outside a
    transaction that statement is rolled back whole, so it is simply run again: the other
    claim has gone on, and its rows now conflict cleanly. Inside one the caller's transaction
    is spoiled, so the error goes up."""
    for attempt in range(tries):
        try:
            Assignment.objects.bulk_create(rows, ignore_conflicts=True)
            return
        except OperationalError as exc:
            if connection.in_atomic_block or attempt == tries - 1 or not isinstance(exc.__cause__, DeadlockDetected):
                raise
            logger.info("hand-out insert lost a deadlock to a parallel claim; inserting again")


def slots_free(slots: dict[int, Sequence[int]]) -> dict[int, list[int]]:
    """Per experience, the ones of its `slots` no live assignment holds: one read for them all."""
    taken: dict[int, set[int]] = {}
    for exp_id, slot in Assignment.objects.filter(experience_id__in=list(slots),
                                                  status__in=_LIVE).values_list("experience_id", "slot"):
        taken.setdefault(exp_id, set()).add(slot)
    return {exp_id: [s for s in some if s not in taken.get(exp_id, set())] for exp_id, some in slots.items()}


# Gold items take slots from here on: every annotator may get one, beside the overlap's slots.
GOLD_SLOT_BASE = 1000
GOLD_SLOTS = range(GOLD_SLOT_BASE, GOLD_SLOT_BASE + 200)


def _claimer(*, run: Run, annotator: User) -> str:
    """Who claims, as the hand-out's seed sees them: the owner, a member by their place among
    the run's members (the order they joined), anyone else (staff) by name. Not the account's
    name or id: the same people claiming in the same order draw the same numbers in another
    database (bench/steering names its raters after the run)."""
    if annotator.pk == run.owner_id:
        return "owner"

    members = list(RunMember.objects.filter(run=run).order_by("id").values_list("user_id", flat=True))
    return f"member {members.index(annotator.pk)}" if annotator.pk in members else f"user {annotator.get_username()}"


def handout_rng(*, run: Run, annotator: User, stream: str) -> random.Random:
    """One stream of `handout_rngs`."""
    return handout_rngs(run=run, annotator=annotator, streams=(stream,))[0]


def handout_rngs(*, run: Run, annotator: User, streams: Sequence[str]) -> list[random.Random]:
    """The random numbers of one claim: seeded by the run's seed and how many hand-outs the run
    has made (every assignment row, skipped ones too), so a given sequence of claims repeats
    its random share, pairs and gold order under the same seed (bench seeds repeat). Who claims
    is in the seed too (`_claimer`): two annotators claiming at the same count draw different
    sequences, so they do not both go for the same random pick (they would only race on its
    slots, which the unique live slot settles, but the loser's random turn would go to the
    rule's next unit). Each of `streams` gets its own generator, so the gold shuffle and the
    selection's draws stay apart: a change to one does not shift the other. The count and who
    claims are read once for all of them."""
    base = f"{run.cfg.seed}:{Assignment.objects.filter(run=run).count()}:{_claimer(run=run, annotator=annotator)}"
    return [random.Random(int.from_bytes(hashlib.sha256(f"{base}:{stream}".encode()).digest()[:8], "big"))
            for stream in streams]


def _claim_selected(*, run: Run, annotator: User, handout: Handout, want: int, expires: datetime) -> list[Assignment]:
    """assignment_claim under a selection rule (apps.feedback.handout.rule), gold items and
    trust-aware hand-out (`feedback.trust`): the same slots and leases, the order and the mix
    decided by the rule. A sibling pair (`selection.pairs`) goes to one annotator whole, so the
    queue may end one over `want`; gold items come between pairs.

    By the annotator's standing (apps.feedback.handout.rule.annotation_handout, which
    annotation_waiting counts from too): an unmeasured one gets gold items only until
    `trust.gold_first` are handed out (their fresh labels would teach the reward model nothing
    until trust is known, and half the budget went to a random rater before); an untrusted one
    gets their unrated gold items first, then only `trust.untrusted_share` of the fresh items,
    the rest staying for trusted annotators. The gold items look like any other item either way."""
    gold_ids = handout.gold_ids
    mine_qs = Assignment.objects.filter(run=run, annotator=annotator)
    mine = mine_qs.count()
    # Both drawn before anything is handed out, from the count the claim starts at. Sorted
    # (handout.gold is): the shuffle repeats under a seed whatever order a set iterates in.
    gold_rng, order_rng = handout_rngs(run=run, annotator=annotator, streams=("gold", "order"))
    fresh_gold = list(handout.gold)
    gold_rng.shuffle(fresh_gold)
    lease = _Lease(run=run, annotator=annotator, expires=expires)
    if handout.standing == "unmeasured" and not handout.fresh_now:
        # Gold only until measured (handout.gold_only: what gold_first leaves of it).
        return _gold_only(lease, fresh_gold, count=min(want, handout.gold_only))
    created: list[Assignment] = []
    if handout.standing == "untrusted":
        created = _gold_only(lease, fresh_gold, count=want)
        fresh_mine = mine_qs.exclude(experience_id__in=handout.gold_ids).count()
        fresh_cap = sum(share_slots(start=fresh_mine, count=want - len(created),
                                    share=run.cfg.feedback.trust.untrusted_share))
        if fresh_cap == 0:
            return created
        want = len(created) + fresh_cap
    return _claim_by_rule(lease, handout=handout, fresh_gold=fresh_gold, order_rng=order_rng, mine=mine, want=want,
                          created=created)


@dataclass(frozen=True)
class _Lease:
    """Who one claim leases to, and until when."""

    run: Run
    annotator: User
    expires: datetime

    def take(self, *, offers: Sequence[tuple[int, Sequence[int], str]], want: int) -> list[Assignment]:
        return slots_take(run=self.run, annotator=self.annotator, offers=offers, want=want, expires=self.expires)


def _gold_take(lease: _Lease, fresh_gold: list[int]) -> Assignment | None:
    """The next of `fresh_gold` (popped) that still has a gold slot free, leased."""
    while fresh_gold:
        pk = fresh_gold.pop()
        got = lease.take(offers=[(pk, slots_free({pk: GOLD_SLOTS})[pk], Assignment.Source.GOLD)], want=1)
        if got:
            return got[0]
    return None


def _gold_only(lease: _Lease, fresh_gold: list[int], *, count: int) -> list[Assignment]:
    """Up to `count` gold items, while there are any to lease."""
    created: list[Assignment] = []
    while len(created) < count:
        got = _gold_take(lease, fresh_gold)
        if got is None:
            break
        created.append(got)
    return created


# A unit to hand out (a sibling pair, or one item) and its source.
Planned = tuple[list[int], str]


@dataclass
class _RuleTurns:
    """Where a rule's hand-out stands between its rounds: the units the rule offers next, the
    gold items left, the gold turns (one a hand-out) and how many of them were served."""

    queue: Iterator[tuple[Sequence[int], str]]
    fresh_gold: list[int]
    gold_turns: list[bool]
    gold_given: int
    ranks: bool  # the rule orders by priority (selection_ranks): else its units are arrivals
    exhausted: bool = field(default=False)


def _claim_by_rule(lease: _Lease, *, handout: Handout, fresh_gold: list[int], order_rng: random.Random, mine: int,
                   want: int, created: list[Assignment]) -> list[Assignment]:
    """The rule's share of a claim after `created` (gold items already leased): the rule's
    units and the gold turns between them, planned and leased round after round."""
    feedback_cfg = lease.run.cfg.feedback
    window = list(handout.fresh[:WINDOW])
    handed_out = Assignment.objects.filter(run=lease.run).exclude(experience_id__in=handout.gold_ids).count()
    order = selection_order(run=lease.run, candidates=window, want=want - len(created), handed_out=handed_out,
                            rng=order_rng)
    # A rule that weighs nothing (gold items or trust alone) hands out in arrival order.
    turns = _RuleTurns(queue=iter(order), fresh_gold=fresh_gold, gold_given=len(created),
                       gold_turns=share_slots(start=mine, count=want + 1, share=feedback_cfg.gold_rate),
                       ranks=selection_ranks(feedback_cfg.selection))
    while len(created) < want and not turns.exhausted:
        # The hand-outs still wanted, in the order the rule and the gold turns give them, then
        # leased in one round (slots_take); a shortfall (a parallel claimer won) plans again.
        plan = _rule_plan(turns, planned=len(created), want=want)
        if not plan:
            break
        created.extend(_plan_lease(lease, turns, plan, overlap=feedback_cfg.overlap))
    return created


def _rule_plan(turns: _RuleTurns, *, planned: int, want: int) -> list[Planned]:
    """The units of one round, from hand-out number `planned` up to `want`."""
    plan: list[Planned] = []
    while planned < want:
        # Gold turns up to this hand-out not yet served (a pair may step over one: it comes next).
        if sum(turns.gold_turns[:planned + 1]) > turns.gold_given and turns.fresh_gold:
            plan.append(([turns.fresh_gold.pop()], Assignment.Source.GOLD))
            turns.gold_given += 1
            planned += 1
            continue
        nxt = next(turns.queue, None)
        if nxt is None:
            turns.exhausted = True
            break
        unit, source = nxt
        plan.append((list(unit), source if source == "random" or turns.ranks else Assignment.Source.ARRIVAL))
        planned += len(unit)
    return plan


def _plan_lease(lease: _Lease, turns: _RuleTurns, plan: Sequence[Planned], *, overlap: int) -> list[Assignment]:
    """Lease one round's units in one go; a unit whose first item a parallel claimer took is
    passed over whole (a gold one gives its turn back)."""
    free = slots_free({pk: GOLD_SLOTS if source == Assignment.Source.GOLD else range(overlap)
                       for members, source in plan for pk in members})
    leased = {a.experience_id: a for a in lease.take(
        want=sum(len(members) for members, _ in plan),
        offers=[(pk, free[pk], source) for members, source in plan for pk in members])}
    created: list[Assignment] = []
    for members, source in plan:
        if members[0] not in leased:
            if source == Assignment.Source.GOLD:
                turns.gold_given -= 1  # its turn comes again, with the next gold item
            stray = [leased.pop(pk).pk for pk in members[1:] if pk in leased]
            if stray:
                Assignment.objects.filter(pk__in=stray).delete()
            continue
        created.extend(leased[pk] for pk in members if pk in leased)
    return created

def assignment_skip(*, assignment: Assignment) -> bool:
    """Put a leased item back for others; the annotator is not offered it again (and it no
    longer holds its group for them)."""
    skipped = bool(
        Assignment.objects.filter(pk=assignment.pk, status=Assignment.Status.LEASED).update(
            status=Assignment.Status.SKIPPED, finished_at=timezone.now(), lease_expires_at=None, held_until=None
        )
    )
    if skipped:
        holds_renew_on_commit(run=assignment.run, annotator=assignment.annotator,
                              also_groups=[assignment.experience.group_id])
    return skipped


def assignments_finish(*, run: Run, annotator: User | None, experience_ids: Sequence[int], group_id: str) -> int:
    """Close the annotator's leases of `experience_ids` (all of one group, `group_id`)."""
    if annotator is None or not getattr(annotator, "is_authenticated", False):
        return 0
    finished = Assignment.objects.filter(
        run=run, annotator=annotator, experience_id__in=list(experience_ids), status=Assignment.Status.LEASED
    ).update(status=Assignment.Status.DONE, finished_at=timezone.now(), lease_expires_at=None, held_until=None)
    # A label is a sign of work: the annotator's other open groups keep waiting for them; the
    # finished items' groups are held only by what else is leased in them.
    holds_renew_on_commit(run=run, annotator=annotator, also_groups=[group_id])
    return finished


