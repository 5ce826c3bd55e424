"""The hand-out rule: what the annotation queue may hand a person and in what order.

What they may be handed (`annotation_handout`, the one definition behind the claim,
apps.feedback.handout.lease, and the count of what waits for them,
apps.feedback.handout.queue): the run's open completions with a free overlap slot they were
never handed (`annotation_candidates`), gold items, and, under `feedback.trust`, as much as
their standing allows. In what order: the run's selection rule orders the queue where a label
teaches the most, instead of arrival order (`feedback.selection` in the run config).

Freshness comes first (`freshness_keys`): groups still waiting for people before trainable
ones, the newest policy's rollouts before older ones; the rule orders within that, and its
ties go to the freshest group. A label can change a group that waits; on an old group it
mostly arrives after the group trained (it then only teaches the reward model).

A candidate's priority is the weighted sum of three sources, each on [0, 1] within the
candidates considered at once:
- uncertainty: the newest version's ensemble of heads disagrees about the item
  (RewardModelScore.spread, rank-normalised: the widest scores 1), or, for a kind without an
  ensemble, its margin between the item and its nearest sibling (same group, same version) is
  small (rank-normalised: the smallest margin scores 1); or two reward-model versions disagree
  about the item — the larger of the two;
- disagreement: the reward model's calibrated score and the automatic reward differ;
- variance: the automatic rewards of the item's group spread widely (population std, scaled by
  the largest among the candidates).
Items without a reward-model score count 0 for the first two. Members of one group follow
each other, so the labels they get make within-group pairs.

With `pairs` (the default) items go out as pairs of siblings, both to one annotator: a rating
teaches the reward model only beside a sibling of the same prompt rated differently by a
trusted rater (apps.feedback.reward_model.preferences), so a label whose siblings no one (or only an
untrusted rater) rated is lost to it. A pair's uncertainty is then the chance that its two
ratings differ under the newest version's calibrated scores p (p_a (1 - p_b) + p_b (1 - p_a)):
a pair straddling the model's decision, one member it calls right and one it calls wrong, or
both near the middle, scores high; two members it scores alike and low (both wrong, the usual
case on a weak policy) score low even when their margin is smallest. Each group's best pair is
chosen (ties: the smaller raw margin when the rule weighs uncertainty, then at random; with no
scores, two random siblings), then its next best among the rest; groups go as blocks at their
best pair's priority.

`random_share` of the hand-outs (counted over the run's hand-outs, pairs with `pairs`, so the
share holds exactly however the claims are sized) are drawn uniformly from the candidates
instead (with `pairs`, a random member and a random sibling of it): an unbiased sample for
evaluation. Gold items are mixed into each annotator's hand-outs at `feedback.gold_rate` the
same way, between pairs, and look like any other item. Each assignment records which of these
handed it out (`Assignment.source`: rule, random, gold; arrival when the rule weighs nothing),
and the reward model's accuracy on the random / arrival share alone is reported beside its
held-out accuracy (`RewardModel.accuracy_random`): the rule's pairs straddle the model's
decision, so accuracy over them is no estimate of how it ranks the rest.
"""

from __future__ import annotations

import math
import random
import statistics
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from django.db.models import Case, Count, Exists, IntegerField, OuterRef, Q, QuerySet, Subquery, Value, When

from apps.buffer.models import Experience
from apps.feedback.models import Assignment, Person
from apps.feedback.raters.reliability import rater_standing
from apps.rewards.models import GoldItem, RewardModel, RewardModelScore
from kernel.config import FeedbackSettings, SelectionRule
from apps.runs.models import Run

_OPEN = (Experience.Status.PENDING, Experience.Status.READY)
_LIVE = (Assignment.Status.LEASED, Assignment.Status.DONE)

WINDOW = 500  # candidates weighed per claim: the freshest waiting groups (annotation_candidates' order)


def selection_active(rule: SelectionRule) -> bool:
    return any((rule.uncertainty, rule.disagreement, rule.variance, rule.random_share))


def selection_ranks(rule: SelectionRule) -> bool:
    """Whether the rule orders by priority at all: with every weight 0 its units go in arrival
    order (pairs: random siblings), reading no reward model, so they are no biased sample."""
    return any((rule.uncertainty, rule.disagreement, rule.variance))


def share_slots(*, start: int, count: int, share: float) -> list[bool]:
    """For hand-outs number start .. start+count-1: which ones fall to the share (exactly
    floor(n x share) of the first n hand-outs do, for every n)."""
    return [math.floor((i + 1) * share) > math.floor(i * share) for i in range(start, start + count)]


@dataclass(frozen=True)
class Priority:
    experience_id: int
    group_id: str
    uncertainty: float
    disagreement: float
    variance: float
    total: float
    spread: float = 0.0  # the ensemble's disagreement alone, rank-normalised (part of uncertainty)


def _rank_normalise(values: dict[int, float], *, small_is_high: bool) -> dict[int, float]:
    if not values:
        return {}
    order = sorted(values, key=lambda k: values[k], reverse=not small_is_high)
    n = len(order)
    if n == 1:
        return {order[0]: 1.0}
    return {k: 1 - i / (n - 1) for i, k in enumerate(order)}


def candidate_priorities(*, run: Run, candidates: Sequence[Experience]) -> list[Priority]:
    """Each candidate's priority under the run's rule, highest first, group members together."""
    rule = run.cfg.feedback.selection
    ids = [c.pk for c in candidates]
    groups = {c.group_id for c in candidates}
    versions = list(RewardModel.objects.filter(run=run).order_by("-version")[:2])
    newest = versions[0] if versions else None
    # Scores of whole groups (siblings need not be candidates) by the two newest versions.
    scores: dict[int, dict[int, float]] = defaultdict(dict)  # version pk -> experience -> score
    group_of: dict[int, str] = {}
    autos: dict[str, list[float]] = defaultdict(list)
    for pk, group, auto in Experience.objects.filter(run=run, group_id__in=groups, is_expert=False).values_list(
            "pk", "group_id", "auto_reward"):
        group_of[pk] = group
        if auto is not None:
            autos[group].append(float(auto))
    spreads: dict[int, float] = {}  # the newest version's ensemble spread, candidates only
    if versions:
        wanted = set(ids)
        for pk, rm_id, s, sd in RewardModelScore.objects.filter(reward_model__in=versions,
                                                                experience_id__in=list(group_of)).values_list(
                "experience_id", "reward_model_id", "score", "spread"):
            scores[rm_id][pk] = s
            if sd is not None and rm_id == versions[0].pk and pk in wanted:
                spreads[pk] = sd
    margins: dict[int, float] = {}
    drift: dict[int, float] = {}
    disagree: dict[int, float] = {}
    if newest is not None:
        mine = scores[newest.pk]
        by_group: dict[str, list[float]] = defaultdict(list)
        for pk, s in mine.items():
            by_group[group_of[pk]].append(s)
        auto_of = {c.pk: c.auto_reward for c in candidates}
        for pk in ids:
            if pk not in mine:
                continue
            siblings = list(by_group[group_of[pk]])
            siblings.remove(mine[pk])
            if siblings:
                margins[pk] = min(abs(mine[pk] - s) for s in siblings)
            if auto_of.get(pk) is not None:
                disagree[pk] = abs(newest.calibrated(mine[pk]) - float(auto_of[pk]))  # type: ignore[arg-type]
            if len(versions) > 1 and pk in scores[versions[1].pk]:
                drift[pk] = abs(newest.calibrated(mine[pk]) - versions[1].calibrated(scores[versions[1].pk][pk]))
    unc = _rank_normalise(margins, small_is_high=True)
    drift_n = _rank_normalise(drift, small_is_high=False) if any(drift.values()) else {}
    spread_n = _rank_normalise(spreads, small_is_high=False) if any(spreads.values()) else {}
    spread = {g: statistics.pstdev(v) if len(v) > 1 else 0.0 for g, v in autos.items()}
    top_spread = max(spread.values(), default=0.0) or 1.0
    out = []
    for c in candidates:
        # The ensemble's disagreement, where the version has one, is the estimate itself and
        # stands in for the margin (its proxy); versions disagreeing count either way.
        u = max(spread_n.get(c.pk, 0.0) if spread_n else unc.get(c.pk, 0.0), drift_n.get(c.pk, 0.0))
        d = min(1.0, disagree.get(c.pk, 0.0))
        v = spread.get(c.group_id, 0.0) / top_spread
        total = rule.uncertainty * u + rule.disagreement * d + rule.variance * v
        out.append(Priority(c.pk, c.group_id, u, d, v, total, spread=spread_n.get(c.pk, 0.0)))
    # A group goes as a block at its best member's priority, within its freshness (see
    # freshness_keys); ties keep the candidates' order (the freshest group first).
    best: dict[str, float] = defaultdict(float)
    for p in out:
        best[p.group_id] = max(best[p.group_id], p.total)
    fresh = freshness_keys(candidates)
    out.sort(key=lambda p: (fresh[p.group_id][:2], -best[p.group_id], fresh[p.group_id][2], -p.total,
                            p.experience_id))
    return out


def freshness_keys(candidates: Sequence[Experience]) -> dict[str, tuple[int, int, int]]:
    """Each candidate group's place before the selection rule weighs it: groups waiting for
    people (pending) first, then the newest policy's (model version, newest first); the third
    part is the group's place in `candidates` (apps.feedback.handout.rule.annotation_candidates
    lists the freshest group first), which breaks the rule's ties. A label on a group still
    waiting can change what trains; one on an old group mostly arrives after it trained."""
    out: dict[str, tuple[int, int, int]] = {}
    for i, c in enumerate(candidates):
        tier = 0 if c.status == Experience.Status.PENDING else 1
        if c.group_id not in out:
            out[c.group_id] = (tier, -c.model_version, i)
        else:
            t, v, pos = out[c.group_id]
            out[c.group_id] = (min(t, tier), min(v, -c.model_version), pos)
    return out


Unit = tuple[int, ...]  # one experience, or two siblings handed out together


def _pair_units(*, run: Run, candidates: Sequence[Experience], priorities: Sequence[Priority],
                rng: random.Random) -> list[Unit]:
    """The candidates as sibling pairs, highest priority first (see the module docstring);
    a group with one candidate left gives a single."""
    rule = run.cfg.feedback.selection
    newest = RewardModel.objects.filter(run=run).order_by("-version").first()
    raw: dict[int, float] = {}
    if newest is not None:
        raw = dict(RewardModelScore.objects.filter(reward_model=newest, experience_id__in=[c.pk for c in candidates])
                   .values_list("experience_id", "score"))
    prio = {p.experience_id: p for p in priorities}
    members: dict[str, list[int]] = defaultdict(list)
    for c in candidates:
        members[c.group_id].append(c.pk)

    def pair_key(a: int, b: int) -> tuple[float, float, float]:
        pa, pb = prio[a], prio[b]
        u = 0.0
        margin = 0.0
        if a in raw and b in raw and newest is not None:
            ca, cb = newest.calibrated(raw[a]), newest.calibrated(raw[b])
            # The chance their ratings differ, or the ensemble's doubt about either member.
            u = max(ca * (1 - cb) + cb * (1 - ca), pa.spread, pb.spread)
            # The smaller margin breaks ties only under uncertainty: a rule without it (or no
            # rule: gold items or trust alone) must not let the model choose the pairs, so
            # that its hand-out stays the unbiased arrival sample (Assignment.source).
            margin = abs(raw[a] - raw[b]) if rule.uncertainty else 0.0
        total = rule.uncertainty * u + rule.disagreement * max(pa.disagreement, pb.disagreement) + \
            rule.variance * max(pa.variance, pb.variance)
        return (total, -margin, rng.random())

    blocks: list[tuple[tuple[float, float], str, list[Unit]]] = []
    for group, ids in members.items():
        left = list(ids)
        units: list[Unit] = []
        best = (0.0, 0.0)  # the best pair's priority, then (ties) its smaller raw margin
        while len(left) > 1:
            key, a, b = max((pair_key(a, b), a, b) for i, a in enumerate(left) for b in left[i + 1:])
            if not units:
                best = key[:2]
            units.append((a, b))
            left.remove(a)
            left.remove(b)
        if left:
            units.append((left[0],))
            if len(units) == 1:
                best = (prio[left[0]].total, 0.0)
        blocks.append((best, group, units))
    fresh = freshness_keys(candidates)
    blocks.sort(key=lambda b: (fresh[b[1]][:2], -b[0][0], -b[0][1], fresh[b[1]][2]))
    # Singles (a group the candidate window cut to one member) after every pair: a single
    # label teaches the reward model nothing until a sibling of it is rated too.
    ranked = [u for _, _, units in blocks for u in units]
    return [u for u in ranked if len(u) == 2] + [u for u in ranked if len(u) == 1]


def _repaired(units: list[Unit], *, group_of: dict[int, str], size: int) -> list[Unit]:
    """Singles of one group joined into a pair at the first one's place (with pairs)."""
    if size == 1:
        return units
    out: list[Unit] = []
    single_at: dict[str, int] = {}
    for u in units:
        if len(u) == 1:
            g = group_of[u[0]]
            if g in single_at:
                i = single_at.pop(g)
                out[i] = out[i] + u
                continue
            single_at[g] = len(out)
        out.append(u)
    return out


def selection_order(*, run: Run, candidates: Sequence[Experience], want: int, handed_out: int,
                    rng: random.Random | None = None) -> list[tuple[Unit, str]]:
    """The candidates in the order to try them, in units (single items, or sibling pairs
    under `pairs`), each with its source ("rule" or "random"). The first units cover `want`
    items and follow the run-wide share of random picks; after them come the remaining
    candidates by priority, for when some are taken by a parallel claimer. `rng` draws the
    random share and breaks ties (the hand-out seeds it: apps.feedback.handout.lease)."""
    rng = rng or random.Random()
    rule = run.cfg.feedback.selection
    priorities = candidate_priorities(run=run, candidates=candidates)
    size = 2 if rule.pairs else 1
    if rule.pairs:
        ranked = _pair_units(run=run, candidates=candidates, priorities=priorities, rng=rng)
    else:
        ranked = [(p.experience_id,) for p in priorities]
    group_of = {c.pk: c.group_id for c in candidates}
    randoms = share_slots(start=handed_out // size, count=-(-want // size), share=rule.random_share)
    order: list[tuple[Unit, str]] = []
    left = list(ranked)
    for is_random in randoms:
        if not left:
            break
        if not is_random:
            order.append((left.pop(0), "rule"))
            continue
        pool = [pk for u in left for pk in u]
        if size == 2:  # a member with a sibling left, where there is one: a random pair, not a lone item
            grouped = Counter(group_of[pk] for pk in pool)
            pool = [pk for pk in pool if grouped[group_of[pk]] > 1] or pool
        first = rng.choice(pool)
        siblings = [pk for pk in pool if pk != first and group_of[pk] == group_of[first]] if size == 2 else []
        pick = (first, rng.choice(siblings)) if siblings else (first,)
        # What the random pick took leaves the rule's units; broken pairs' other members pair up again.
        left = _repaired([r for r in (tuple(pk for pk in u if pk not in pick) for u in left) if r],
                         group_of=group_of, size=size)
        order.append((pick, "random"))
    order.extend((u, "rule") for u in left)
    return order


def annotation_candidates(*, run: Run, annotator: Person) -> QuerySet[Experience]:
    """What the annotation queue may still hand `annotator`: the run's open completions (a
    label on them still moves a reward) with a free overlap slot that they were never handed,
    in the order a label can still change most: groups waiting for people (pending) before
    groups already trainable (ready), the newest policy's rollouts first (model version), the
    freshest group first within a version (its first member's id), members in order. The
    selection rule (apps.feedback.handout.rule) reorders within this order and keeps it for ties.

    Freshest rather than oldest: an old pending group is the one closest to its wait window's
    end (or already trained when the label arrives), and its completions come from a policy the
    run has left behind; a fresh one gives the person the whole window."""
    group_first = Experience.objects.filter(run=run, group_id=OuterRef("group_id")).order_by("id").values("id")[:1]
    return (
        _open_candidates(run=run, annotator=annotator)
        .annotate(waiting=Case(When(status=Experience.Status.PENDING, then=Value(0)), default=Value(1),
                               output_field=IntegerField()),
                  group_first=Subquery(group_first))
        .order_by("waiting", "-model_version", "-group_first", "id")
    )


def _open_candidates(*, run: Run, annotator: Person) -> QuerySet[Experience]:
    """annotation_candidates' items, in no order: what a count reads. The order's group_first
    is a subquery per row, which a count computed all the same (11 ms of Postgres per count on
    300 open completions against 0.7 ms without it; the counts poll asks every 10 s a person)."""
    mine = Assignment.objects.filter(experience=OuterRef("pk"), annotator_id=annotator.pk)
    return (
        Experience.objects.filter(run=run, is_expert=False, status__in=_OPEN)
        .annotate(live=Count("assignments", filter=Q(assignments__status__in=_LIVE)))
        .filter(live__lt=run.cfg.feedback.overlap)
        .exclude(Exists(mine))
    )

def trust_handout(feedback_cfg: FeedbackSettings) -> bool:
    """Whether the hand-out follows each annotator's standing (`feedback.trust` set, and
    trust measured: a rater weighting on)."""
    return feedback_cfg.rater_weighting != "off" and bool(feedback_cfg.trust.gold_first or feedback_cfg.trust.untrusted_share < 1)


def handout_selects(feedback_cfg: FeedbackSettings) -> bool:
    """Whether the hand-out goes by a rule (apps.feedback.handout.lease._claim_selected: selection,
    gold items, trust) rather than arrival order alone."""
    return feedback_cfg.gold_rate > 0 or selection_active(feedback_cfg.selection) or trust_handout(feedback_cfg)


@dataclass(frozen=True)
class Handout:
    """What the annotation queue may hand `annotator` now, as the claim decides it: the one
    definition behind both the claim (apps.feedback.handout.lease.assignment_claim) and the count
    of what waits for them (annotation_waiting), so a count above the queue's items always
    means a claim brings more ("117 waiting for you" beside an empty queue that "Load new
    items" could not fill: the count read the candidates, the claim its gold-only rule)."""

    fresh: QuerySet[Experience]  # the items it hands out, in its order (under a rule: no gold items)
    fresh_now: bool  # False: none of `fresh` for now (a new rater's first gold items; an untrusted one at share 0)
    gold: list[int]  # gold items never handed to them, when the rule hands them out (sorted)
    gold_ids: frozenset[int]  # every gold item of the run, under a rule
    gold_only: int  # under trust, gold items before any fresh one (a new rater: up to gold_first; untrusted: all)
    standing: str | None  # apps.feedback.raters.reliability.rater_standing, where the hand-out follows it
    countable: QuerySet[Experience] | None = None  # `fresh` in no order, for count (None: fresh)

    def count(self) -> int:
        """The items a claim would hand out, one claim after another, as things stand."""
        fresh = self.fresh if self.countable is None else self.countable
        return self.gold_only + (fresh.order_by().count() if self.fresh_now else 0)


def annotation_handout(*, run: Run, annotator: Person) -> Handout:
    feedback_cfg = run.cfg.feedback
    candidates = annotation_candidates(run=run, annotator=annotator)
    unordered = _open_candidates(run=run, annotator=annotator)
    if not handout_selects(feedback_cfg):
        return Handout(fresh=candidates, fresh_now=True, gold=[], gold_ids=frozenset(), gold_only=0, standing=None,
                       countable=unordered)
    gold_ids = frozenset(GoldItem.objects.filter(run=run).values_list("experience_id", flat=True))
    mine = Assignment.objects.filter(run=run, annotator_id=annotator.pk)
    gold = sorted(gold_ids - set(mine.values_list("experience_id", flat=True)))
    fresh = candidates.exclude(pk__in=gold_ids)
    unordered = unordered.exclude(pk__in=gold_ids)
    standing = rater_standing(run=run, annotator_id=annotator.pk or 0) if trust_handout(feedback_cfg) else None
    trust = feedback_cfg.trust
    if standing == "unmeasured" and trust.gold_first and gold:
        # Gold only until measured; gold already handed out counts (skipped ones do not).
        given = mine.filter(experience_id__in=gold_ids).exclude(status=Assignment.Status.SKIPPED).count()
        return Handout(fresh=fresh, fresh_now=False, gold=gold, gold_ids=gold_ids, gold_only=min(len(gold), max(0, trust.gold_first - given)),
                       standing=standing, countable=unordered)
    if standing == "untrusted":
        return Handout(fresh=fresh, fresh_now=trust.untrusted_share > 0, gold=gold, gold_ids=gold_ids, gold_only=len(gold),
                       standing=standing, countable=unordered)
    return Handout(fresh=fresh, fresh_now=True, gold=gold, gold_ids=gold_ids, gold_only=0, standing=standing,
                   countable=unordered)
