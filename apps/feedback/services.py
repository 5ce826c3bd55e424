"""Feedback services: the annotation queue (assignments under a lease), storing feedback,
and folding it into experience rewards under the run's policy (see kernel.feedback_policy).

Every piece of feedback is stored as its own row, whatever happens to its target. Feedback
whose target was already taken by the trainer (leased or consumed) or dropped is stored
with late=True, counted, and left out of the fold: the reward the trainer saw stays the
reward the buffer shows, and the late rows stay available to DPO, SFT and export.
"""

from __future__ import annotations

import hashlib
import logging
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TypeVar

from django.conf import settings
from django.db import transaction
from django.contrib.auth.models import User
from django.db.models import Model, Q, QuerySet
from django.utils import timezone

from apps.buffer.drafts import ExperienceDraft
from apps.buffer.models import Experience
from apps.buffer.services import experience_write
from apps.feedback.holds import Person, holds_renew, holds_renew_on_commit
from apps.feedback.kinds import KindValue, kind_get, kind_names, kind_service
from apps.feedback.kinds.edit import EditValue
from apps.feedback.kinds.env_reward import EnvRewardValue
from apps.feedback.kinds.flag import FlagValue
from apps.feedback.kinds.pairwise import PairwiseValue
from apps.feedback.kinds.ranking import RankingValue
from apps.feedback.kinds.rating import RatingValue
from apps.feedback.models import Assignment, Feedback
from apps.feedback.selectors import Handout, annotation_handout, handout_selects, queue_item_counts, trust_handout
from apps.feedback.reliability import rater_offsets_cached, rater_weights_cached
from apps.feedback.selection import WINDOW, selection_order, selection_ranks, share_slots
from apps.rewards.models import GoldItem
from apps.runs.events import event_publish
from kernel.feedback_policy import (
    DROP_REASON,
    feedback_is_late,
    member_is_final,
    reward_combine,
    signals_fold,
)
from apps.runs.models import Run, RunMember
from apps.runs.selectors import run_takes_feedback
from kernel.exceptions import Conflict, InvalidInput, NotFound

log = logging.getLogger(__name__)

_OPEN = (Experience.Status.PENDING, Experience.Status.READY)
_LIVE = (Assignment.Status.LEASED, Assignment.Status.DONE)

# The environment API's key that sent the feedback (an envapi.ApiKey row, Feedback.api_key's
# FK): the envapi app sits above this one (pyproject.toml's layers), so its model is not
# imported here: a row is all this app needs of it.
ApiKeyRow = Model
V = TypeVar("V", bound=KindValue)


def _lease_seconds() -> float:
    return settings.RFT_ANNOTATION_LEASE_SECONDS


# ---------------------------------------------------------------- assignments


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
    the annotator has open (apps.feedback.holds).

    What a label can still change comes first (apps.feedback.selectors.annotation_candidates:
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
    # beside them (the queue shows them first, apps.feedback.selectors.annotation_queue).
    want = size - Assignment.objects.filter(run=run, annotator=annotator, status=Assignment.Status.LEASED).filter(
        queue_item_counts()).count()
    if want <= 0:
        return []
    overlap = run.cfg.feedback.overlap
    expires = timezone.now() + timedelta(seconds=lease_seconds if lease_seconds is not None else _lease_seconds())
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
        free = _slots_free(dict.fromkeys(window, range(overlap)))
        created += _slots_take(run=run, annotator=annotator, want=want - len(created), expires=expires,
                               offers=[(exp_id, free[exp_id], Assignment.Source.ARRIVAL) for exp_id in window])
        if len(created) >= want:
            return created
    return created


def _slots_take(*, run: Run, annotator: User, offers: Sequence[tuple[int, Sequence[int], str]], want: int,
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
        Assignment.objects.bulk_create(
            [Assignment(run=run, experience_id=exp_id, annotator=annotator, slot=slots[0], lease_expires_at=expires,
                        source=source) for exp_id, slots, source in batch],
            ignore_conflicts=True)
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


def _slots_free(slots: dict[int, Sequence[int]]) -> dict[int, list[int]]:
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
    """assignment_claim under a selection rule (apps.feedback.selection), gold items and
    trust-aware hand-out (`feedback.trust`): the same slots and leases, the order and the mix
    decided by the rule. A sibling pair (`selection.pairs`) goes to one annotator whole, so the
    queue may end one over `want`; gold items come between pairs.

    By the annotator's standing (apps.feedback.selectors.annotation_handout, which
    annotation_waiting counts from too): an unmeasured one gets gold items only until
    `trust.gold_first` are handed out (their fresh labels would teach the reward model nothing
    until trust is known, and half the budget went to a random rater before); an untrusted one
    gets their unrated gold items first, then only `trust.untrusted_share` of the fresh items,
    the rest staying for trusted annotators. The gold items look like any other item either way."""
    policy = run.cfg.feedback
    trust = policy.trust
    gold_ids = handout.gold_ids
    mine_qs = Assignment.objects.filter(run=run, annotator=annotator)
    mine = mine_qs.count()
    # Both drawn before anything is handed out, from the count the claim starts at. Sorted
    # (handout.gold is): the shuffle repeats under a seed whatever order a set iterates in.
    gold_rng, order_rng = handout_rngs(run=run, annotator=annotator, streams=("gold", "order"))
    fresh_gold = list(handout.gold)
    gold_rng.shuffle(fresh_gold)
    created: list[Assignment] = []

    def gold_take() -> Assignment | None:
        while fresh_gold:
            pk = fresh_gold.pop()
            got = _slots_take(run=run, annotator=annotator, want=1, expires=expires, offers=[
                (pk, _slots_free({pk: GOLD_SLOTS})[pk], Assignment.Source.GOLD)])
            if got:
                return got[0]
        return None

    if handout.standing == "unmeasured" and not handout.fresh_now:
        # Gold only until measured (handout.gold_only: what gold_first leaves of it).
        for _ in range(min(want, handout.gold_only)):
            got = gold_take()
            if got is None:
                break
            created.append(got)
        return created
    if handout.standing == "untrusted":
        while len(created) < want:
            got = gold_take()
            if got is None:
                break
            created.append(got)
        fresh_mine = mine_qs.exclude(experience_id__in=gold_ids).count()
        fresh_cap = sum(share_slots(start=fresh_mine, count=want - len(created), share=trust.untrusted_share))
        if fresh_cap == 0:
            return created
        want = len(created) + fresh_cap

    window = list(handout.fresh[:WINDOW])
    handed_out = Assignment.objects.filter(run=run).exclude(experience_id__in=gold_ids).count()
    order = selection_order(run=run, candidates=window, want=want - len(created), handed_out=handed_out,
                            rng=order_rng)
    # A rule that weighs nothing (gold items or trust alone) hands out in arrival order.
    ranks = selection_ranks(policy.selection)
    gold_turns = share_slots(start=mine, count=want + 1, share=policy.gold_rate)
    queue = iter(order)

    gold_given = len(created)
    exhausted = False
    while len(created) < want and not exhausted:
        # The hand-outs still wanted, in the order the rule and the gold turns give them, then
        # leased in one round (_slots_take); a shortfall (a parallel claimer won) plans again.
        plan: list[tuple[list[int], str]] = []  # units (a pair, or one item) and their source
        planned = len(created)
        while planned < want:
            # Gold turns up to this hand-out not yet served (a pair may step over one: it comes next).
            if sum(gold_turns[:planned + 1]) > gold_given and fresh_gold:
                plan.append(([fresh_gold.pop()], Assignment.Source.GOLD))
                gold_given += 1
                planned += 1
                continue
            nxt = next(queue, None)
            if nxt is None:
                exhausted = True
                break
            unit, source = nxt
            plan.append((list(unit), source if source == "random" or ranks else Assignment.Source.ARRIVAL))
            planned += len(unit)
        if not plan:
            break
        free = _slots_free({pk: GOLD_SLOTS if source == Assignment.Source.GOLD else range(policy.overlap)
                            for members, source in plan for pk in members})
        leased = {a.experience_id: a for a in _slots_take(
            run=run, annotator=annotator, expires=expires, want=sum(len(members) for members, _ in plan),
            offers=[(pk, free[pk], source) for members, source in plan for pk in members])}
        for members, source in plan:
            if members[0] not in leased:
                # A pair whose first member a parallel claimer took is passed over whole.
                if source == Assignment.Source.GOLD:
                    gold_given -= 1  # its turn comes again, with the next gold item
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


def _assignments_finish(*, run: Run, annotator: User | None, experience_ids: Sequence[int], group_id: str) -> int:
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


# ---------------------------------------------------------------- folding


@dataclass(frozen=True)
class FoldResult:
    updated: int
    became_ready: bool


def _locked_members(*, run: Run, group_id: str) -> list[Experience]:
    # Lock the group in id order (so two folds cannot deadlock) for the read-compute-write;
    # a second fold of the same group waits and then sees the first one's feedback.
    return list(
        Experience.objects.select_for_update()
        .filter(run=run, group_id=group_id, is_expert=False)
        .order_by("id")
    )


def _group_feedback(*, run: Run, group_id: str, member_ids: Sequence[int]) -> list[Feedback]:
    """The group's feedback of the kinds that fold: on a member, or (a group's kinds) on the group;
    none the owner rejected (apps.feedback.review)."""
    on = Q(pk__in=[])
    for name in kind_names(folds=True):
        target = kind_get(name).target
        on |= Q(kind=name, group_id=group_id) if target == "group" else Q(kind=name, experience_id__in=list(member_ids))
    return list(
        Feedback.objects.effective().filter(run=run, late=False).filter(on)
        .only("kind", "experience_id", "author_id", "api_key_id", "value")
    )


def group_fold(*, run: Run, group_id: str, members: list[Experience] | None = None) -> FoldResult:
    """Recompute the human and final rewards of a group's open members from their feedback,
    and make the group trainable when every member's reward is final. Call inside a
    transaction (the feedback services do); idempotent."""
    policy = run.cfg.feedback
    if members is None:
        members = _locked_members(run=run, group_id=group_id)

    folds = signals_fold(member_ids=[m.pk for m in members], feedback=_group_feedback(
        run=run, group_id=group_id, member_ids=[m.pk for m in members]), weights=rater_weights_cached(run=run),
        offsets=rater_offsets_cached(run=run))
    changed: list[Experience] = []
    for m in members:
        if m.status not in _OPEN:
            continue
        fold = folds[m.pk]
        human = fold.human
        reward = reward_combine(policy=policy, auto=m.auto_reward, human=human) if policy.mode != "auto" else None
        before = (m.human_reward, m.reward)
        if human is not None:
            m.human_reward = human
        if reward is not None:
            m.reward = reward
        if (m.human_reward, m.reward) != before:
            changed.append(m)
    # One statement for the group, whatever its size (a ranking of 64 changes 64 rows): both
    # fields written on each changed row, the unchanged one as it was read under the lock.
    if changed:
        Experience.objects.bulk_update(changed, ["human_reward", "reward"])
    updated = len(changed)
    became_ready = False
    if policy.mode != "auto" and any(m.status == Experience.Status.PENDING for m in members):
        if all(m.status != Experience.Status.PENDING or member_is_final(policy=policy, fold=folds[m.pk]) for m in members):
            became_ready = bool(
                Experience.objects.filter(pk__in=[m.pk for m in members], status=Experience.Status.PENDING).update(
                    status=Experience.Status.READY
                )
            )
    return FoldResult(updated=updated, became_ready=became_ready)


# ---------------------------------------------------------------- submitting
#
# One service per kind of feedback; the annotation page, the environment API and the CLI
# all call these. Each builds its value in the kind's one shape (its typed model in
# apps.feedback.kinds),
# decides lateness by the one rule (policy.feedback_is_late), stores the row, folds it
# into the group when it bears on rewards, and announces `feedback.saved`.


def _new(kind: str, cls: type[V], **fields: object) -> V:
    """A new value of `kind`: its typed model (`cls`, the one the caller reads), checked in
    its constructor."""
    value = kind_get(kind).Value(**fields)
    if not isinstance(value, cls):
        raise TypeError(f"{kind} feedback holds a {type(value).__name__}, not a {cls.__name__}")
    return value


def _clean_comment(comment: str | None) -> str:
    comment = (comment or "").strip()
    if len(comment) > 5000:
        raise InvalidInput("a comment is at most 5000 characters", field="comment")
    return comment


def _experience_of(run: Run, experience: Experience | int | None, what: str) -> Experience:
    if experience is None:
        raise InvalidInput(f"{what} is required", field=what)
    pk = experience.pk if isinstance(experience, Experience) else experience
    found = Experience.objects.filter(run=run, pk=pk).first()
    if found is None:
        raise NotFound(f"experience {pk} is not an experience of run {run.pk}", field=what)
    return found


def _person(author: Person | None) -> User | None:
    return author if isinstance(author, User) and author.is_authenticated else None


def _store(
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
        group_id=group_id, author=author, api_key_id=api_key.pk if api_key is not None else None, value=value.stored(), comment=comment, late=late,
    )


class FeedbackClosed(Conflict):
    """Feedback on a finished or failed run: nothing it could change is left (a 409)."""

    def __init__(self, run: Run) -> None:
        why = "its training is done" if run.status == Run.Status.FINISHED else "it trains nothing until it is started again"
        super().__init__(f"run {run.pk} is {run.status}: it takes no more feedback ({why})", field="run")


def _gold_targets(*, run: Run, targets: Sequence[Experience]) -> bool:
    return GoldItem.objects.filter(run=run, experience_id__in=[t.pk for t in targets]).exists()


def _announce(*, run: Run, feedback: Feedback, ready: bool) -> None:
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


def _fold_and_finish(*, run: Run, feedback: Feedback, members: list[Experience], targets: Sequence[int]) -> Feedback:
    fold = FoldResult(updated=0, became_ready=False)
    if not feedback.late:
        fold = group_fold(run=run, group_id=feedback.group_id, members=members)
    _assignments_finish(run=run, annotator=feedback.author, experience_ids=targets, group_id=feedback.group_id)
    _announce(run=run, feedback=feedback, ready=fold.became_ready)
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
    comment, author = _clean_comment(comment), _person(author)
    with transaction.atomic():
        # A row the caller read from this run (the page's assignment) gives its group; the
        # group's locked read below is then the one read of it (an expert experience, in no
        # group's members, or one gone meanwhile is read, or refused, by _experience_of).
        given = experience if isinstance(experience, Experience) and experience.run_id == run.pk else None
        target = given or _experience_of(run, experience, "experience_id")
        members = _locked_members(run=run, group_id=target.group_id)
        locked = next((m for m in members if m.pk == target.pk), None)
        if locked is None and given is not None:  # not read yet: an expert experience, or gone
            locked = _experience_of(run, target.pk, "experience_id")
        target = locked or target
        fb = _store(run=run, kind=kind, value=value, targets=[target], group_id=target.group_id,
                    author=author, api_key=api_key, comment=comment)
        if folds:
            return _fold_and_finish(run=run, feedback=fb, members=members, targets=[target.pk])
        _assignments_finish(run=run, annotator=fb.author, experience_ids=[target.pk], group_id=target.group_id)
        _announce(run=run, feedback=fb, ready=False)
        return fb


@kind_service(Feedback.Kind.RATING)
def feedback_rate(
    *, run: Run, experience: Experience | int | None, score: int | None = None, thumb: str | None = None,
    author: Person | None = None, api_key: ApiKeyRow | None = None, comment: str = "",
) -> Feedback:
    """A rating of one completion: a score 1..5 or a thumb; folded into its group's
    rewards (unless late) and closing the author's assignment of it."""
    value = _new(Feedback.Kind.RATING, RatingValue, score=score, thumb=thumb)
    return feedback_store(run=run, kind=Feedback.Kind.RATING, value=value, experience=experience, author=author,
                          api_key=api_key, comment=comment)


@kind_service(Feedback.Kind.RANKING)
def feedback_rank(
    *, run: Run, order: Sequence[int], group_id: str | None = None, author: Person | None = None,
    api_key: ApiKeyRow | None = None, comment: str = "",
) -> Feedback:
    """A ranking of a whole group, best first. The group is the one the ranked
    experiences share (`group_id`, when given, must be it)."""
    value = _new(Feedback.Kind.RANKING, RankingValue, order=order)
    comment, author = _clean_comment(comment), _person(author)
    with transaction.atomic():
        first = _experience_of(run, value.order[0], "order")
        if group_id is not None and str(group_id) != first.group_id:
            raise InvalidInput(f"experience {first.pk} is not in group {group_id!r}", field="order")
        members = _locked_members(run=run, group_id=first.group_id)
        if sorted(value.order) != sorted(m.pk for m in members):
            raise InvalidInput(
                f"a ranking orders every completion of the group exactly once ({len(members)} in group)", field="order")
        fb = _store(run=run, kind=Feedback.Kind.RANKING, value=value, targets=members, group_id=first.group_id,
                    author=author, api_key=api_key, comment=comment)
        return _fold_and_finish(run=run, feedback=fb, members=members, targets=value.order)


@kind_service(Feedback.Kind.PAIRWISE)
def feedback_compare(
    *, run: Run, experience: Experience | int | None, other: Experience | int | None, winner: str,
    author: Person | None = None, api_key: ApiKeyRow | None = None, comment: str = "",
) -> Feedback:
    """A choice between two completions of one group: winner "a" (`experience`), "b"
    (`other`) or "tie". Stored for DPO (trainer and export); it moves no reward."""
    value = _new(Feedback.Kind.PAIRWISE, PairwiseValue, winner=winner)
    comment, author = _clean_comment(comment), _person(author)
    with transaction.atomic():
        a = _experience_of(run, experience, "experience_id")
        b = _experience_of(run, other, "other_experience_id")
        if a.pk == b.pk:
            raise InvalidInput("a comparison needs two different completions", field="other_experience_id")
        if a.group_id != b.group_id:
            raise InvalidInput("a comparison is between completions of one prompt (one group)",
                               field="other_experience_id")
        fb = _store(run=run, kind=Feedback.Kind.PAIRWISE, value=value, targets=[a, b], group_id=a.group_id,
                    author=author, api_key=api_key, comment=comment, other=b)
        _announce(run=run, feedback=fb, ready=False)
    return fb


@kind_service(Feedback.Kind.FLAG)
def feedback_flag(
    *, run: Run, experience: Experience | int | None, flags: Sequence[str] = (), reason: str = "",
    author: Person | None = None, api_key: ApiKeyRow | None = None, comment: str = "",
) -> Feedback:
    """A flag on one completion (unsafe, broken, off_task, and/or a reason in words). A
    flag is a judgement of the item too: it leaves the author's queue."""
    value = _new(Feedback.Kind.FLAG, FlagValue, flags=flags, reason=reason)
    comment, author = _clean_comment(comment), _person(author)
    with transaction.atomic():
        target = _experience_of(run, experience, "experience_id")
        fb = _store(run=run, kind=Feedback.Kind.FLAG, value=value, targets=[target], group_id=target.group_id,
                    author=author, api_key=api_key, comment=comment)
        _assignments_finish(run=run, annotator=author, experience_ids=[target.pk], group_id=target.group_id)
        _announce(run=run, feedback=fb, ready=False)
    return fb


@kind_service(Feedback.Kind.ENV_REWARD)
def feedback_env_reward(
    *, run: Run, experience: Experience | int | None, reward: float, reward_parts: Mapping[str, float] | None = None,
    author: Person | None = None, api_key: ApiKeyRow | None = None, comment: str = "",
) -> Feedback:
    """An environment's reward for one experience: it becomes the experience's automatic
    reward (its parts merged into reward_parts), and the policy recomputes the training
    reward (auto: the reward itself, making a pending experience ready; blend: combined
    with the human fold). Late: stored, reward unchanged under the trainer's feet."""
    value = _new(Feedback.Kind.ENV_REWARD, EnvRewardValue, reward=reward, reward_parts=reward_parts or {})
    comment, author = _clean_comment(comment), _person(author)
    with transaction.atomic():
        target = _experience_of(run, experience, "experience_id")
        members = _locked_members(run=run, group_id=target.group_id) if not target.is_expert else []
        locked = next((m for m in members if m.pk == target.pk), None) or \
            Experience.objects.select_for_update().get(pk=target.pk)
        fb = _store(run=run, kind=Feedback.Kind.ENV_REWARD, value=value, targets=[locked], group_id=locked.group_id,
                    author=author, api_key=api_key, comment=comment)
        ready = False
        if not fb.late:
            locked.auto_reward = value.reward
            locked.reward_parts = {**(locked.reward_parts or {}), **value.reward_parts}
            update = ["auto_reward", "reward_parts"]
            if run.cfg.feedback.mode == "auto":
                locked.reward = value.reward
                update.append("reward")
                if locked.status == Experience.Status.PENDING:
                    locked.status = Experience.Status.READY
                    update.append("status")
                    ready = True
            locked.save(update_fields=update)
            if run.cfg.feedback.mode != "auto" and members:
                ready = group_fold(run=run, group_id=locked.group_id, members=members).became_ready
        _announce(run=run, feedback=fb, ready=ready)
    return fb


def feedback_rate_and_flag(
    *, run: Run, author: Person | None, experience: Experience | int, score: int | None = None, thumb: str | None = None,
    flags: Sequence[str] = (), comment: str = "",
) -> list[Feedback]:
    """The annotation form's submit: a rating and/or flags on one completion, all or none."""
    if score is None and thumb is None and not flags:
        raise InvalidInput("give a rating (1-5 or a thumb) or at least one flag", field="score")
    if score is not None and thumb is not None:
        raise InvalidInput("give a score or a thumb, not both", field="score")

    def rate(note: str) -> Feedback:
        return feedback_rate(run=run, author=author, experience=experience, score=score, thumb=thumb, comment=note)

    def flag(note: str) -> Feedback:
        return feedback_flag(run=run, author=author, experience=experience, flags=flags, comment=note)

    # One label is its own service's transaction: wrapped in another, it cost a savepoint and
    # its release, two of a rating's round trips to the database.
    if not flags:
        return [rate(comment)]
    if score is None and thumb is None:
        return [flag(comment)]
    with transaction.atomic():
        return [rate(comment), flag("")]


@kind_service(Feedback.Kind.EDIT)
def feedback_edit(*, run: Run, author: Person | None, experience: Experience | int, text: str, comment: str = "") -> tuple[Feedback, Experience]:
    """A corrected completion: written through experience_write as an expert experience
    (is_expert, parent = the original, source human) and recorded as edit feedback.

    The key is stable in (original, author, text), so a resubmitted form writes nothing
    twice while a revised correction is a new expert experience. Token ids are left empty:
    the web side has no tokenizer; the trainer tokenises prompt_text + response_text.
    """
    if not run_takes_feedback(run=run):
        raise FeedbackClosed(run)  # before the expert row is written
    text = (text or "").replace("\r\n", "\n")
    if not text.strip():
        raise InvalidInput("a correction needs some text", field="text")
    if len(text) > 100_000:
        raise InvalidInput("a correction is at most 100000 characters", field="text")
    comment, author = _clean_comment(comment), _person(author)
    with transaction.atomic():
        parent = _experience_of(run, experience, "experience_id")
        if parent.is_expert:
            raise InvalidInput("edit the original completion, not a correction", field="experience_id")
        digest = hashlib.sha256(text.encode()).hexdigest()[:16]
        key = f"edit:{parent.pk}:{author.pk if author else 'anon'}:{digest}"
        result = experience_write(experiences=[ExperienceDraft(
            run_id=run.pk,
            key=key,
            group_id=f"expert-{parent.pk}",
            task_id=parent.task_id,
            source=Experience.Source.HUMAN,
            prompt_text=parent.prompt_text,
            response_text=text,
            is_expert=True,
            parent_id=parent.pk,
            status=Experience.Status.READY,
            # A correction is the annotator's best answer: the top of the human scale.
            human_reward=1.0,
            reward=1.0,
            model_version=parent.model_version,
            metadata={"edit_of": parent.pk, "author": author.get_username() if author else None},
        )], announce=True)
        expert = Experience.objects.get(pk=result.ids[0])
        value = _new(Feedback.Kind.EDIT, EditValue, expert_id=expert.pk)
        fb = Feedback.objects.filter(run=run, kind=Feedback.Kind.EDIT, experience=parent, value__expert_id=expert.pk).first()
        if fb is None:
            fb = _store(run=run, kind=Feedback.Kind.EDIT, value=value, targets=[parent], group_id=parent.group_id,
                        author=author, api_key=None, comment=comment)
            _announce(run=run, feedback=fb, ready=False)
    return fb, expert


# ---------------------------------------------------------------- wait windows


@dataclass(frozen=True)
class ExpireResult:
    groups_ready: int
    groups_dropped: int


def feedback_wait_expire(*, now: datetime | None = None) -> ExpireResult:
    """End the wait windows that have run out: for each group with a member pending longer
    than its run's `wait_seconds`, apply the run's fallback. Idempotent (conditional
    updates on status pending), so overlapping beats do no harm."""
    now = now or timezone.now()
    ready = dropped = 0
    for run in Run.objects.filter(experiences__status=Experience.Status.PENDING).distinct():
        policy = run.cfg.feedback
        cutoff = now - timedelta(seconds=policy.wait_seconds)
        groups = list(
            Experience.objects.filter(run=run, status=Experience.Status.PENDING, created_at__lte=cutoff)
            .values_list("group_id", flat=True).distinct()
        )
        for group_id in groups:
            outcome = _group_expire(run=run, group_id=group_id)
            ready += outcome == "ready"
            dropped += outcome == "dropped"
    if ready or dropped:
        log.info("feedback_wait_expire: %d groups made trainable, %d dropped", ready, dropped)
    return ExpireResult(groups_ready=ready, groups_dropped=dropped)


def _fallback_human(members: Sequence[Experience]) -> float | None:
    """The human reward an unrated member stands in with when the wait window ends: the mean
    of its rated siblings' (None when no member is rated: the group then trains on the
    automatic reward alone). On the blended scale of its rated siblings (w_auto * auto +
    w_human * this), so it neither outranks a rated right answer nor is favoured over a rated
    wrong one for lack of a rating (the automatic reward alone, e.g. a format reward of 1.0
    beside rated members' 0.2 / 1.2, put every unrated member above every rated wrong one)."""
    rated = [m.human_reward for m in members if m.human_reward is not None and not m.is_expert]
    return sum(rated) / len(rated) if rated else None


def _group_expire(*, run: Run, group_id: str) -> str | None:
    policy = run.cfg.feedback
    with transaction.atomic():
        members = _locked_members(run=run, group_id=group_id)
        pending = [m for m in members if m.status == Experience.Status.PENDING]
        if not pending:
            return None
        group_fold(run=run, group_id=group_id, members=members)
        without = [m for m in pending if m.reward is None]
        if without and (policy.fallback == "drop" or any(m.auto_reward is None for m in without)):
            # No usable reward for some member: a group with a hole cannot be trained on.
            Experience.objects.filter(pk__in=[m.pk for m in members], status__in=_OPEN).update(
                status=Experience.Status.FILTERED,
                filter_reason=DROP_REASON if policy.fallback == "drop"
                else "feedback: wait window ended and a member has neither human nor automatic reward",
            )
            outcome = "dropped"
        else:
            fill = _fallback_human(members)
            for m in without:
                reward = m.auto_reward if fill is None else reward_combine(policy=policy, auto=m.auto_reward, human=fill)
                Experience.objects.filter(pk=m.pk, status=Experience.Status.PENDING).update(reward=reward)
            Experience.objects.filter(pk__in=[m.pk for m in pending], status=Experience.Status.PENDING).update(
                status=Experience.Status.READY
            )
            outcome = "ready"
    return outcome
