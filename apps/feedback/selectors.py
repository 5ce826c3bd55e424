"""Reads of feedback: the annotator's queue, counts, and the DPO pairs the trainer takes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypedDict

from django.db.models import Case, Count, Exists, IntegerField, OuterRef, Q, QuerySet, Subquery, Value, When

from apps.buffer.models import Experience
from apps.feedback.holds import Person
from apps.feedback.kinds import kind_get, kind_names, preference_kind_names
from apps.feedback.ledger import kind_refusal
from apps.feedback.models import Assignment, Feedback
from apps.feedback.reliability import rater_standing
from apps.feedback.selection import selection_active
from apps.rewards.models import GoldItem
from kernel.config import FeedbackSettings
from apps.runs.models import Run, RunMember
from apps.runs.selectors import run_role, run_takes_feedback


def run_may_annotate(*, run: Run, user: Person) -> bool:
    """Owners, staff and the run's annotators give feedback; viewers only look."""
    return run_role(run=run, user=user) in ("owner", "annotator")


_OPEN = (Experience.Status.PENDING, Experience.Status.READY)
_LIVE = (Assignment.Status.LEASED, Assignment.Status.DONE)


def annotation_candidates(*, run: Run, annotator: Person) -> QuerySet[Experience]:
    """What the annotation queue may still hand `annotator`: the run's open completions (a
    label on them still moves a reward) with a free overlap slot that they were never handed,
    in the order a label can still change most: groups waiting for people (pending) before
    groups already trainable (ready), the newest policy's rollouts first (model version), the
    freshest group first within a version (its first member's id), members in order. The
    selection rule (apps.feedback.selection) reorders within this order and keeps it for ties.

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


def trust_handout(feedback_cfg: FeedbackSettings) -> bool:
    """Whether the hand-out follows each annotator's standing (`feedback.trust` set, and
    trust measured: a rater weighting on)."""
    return feedback_cfg.rater_weighting != "off" and bool(feedback_cfg.trust.gold_first or feedback_cfg.trust.untrusted_share < 1)


def handout_selects(feedback_cfg: FeedbackSettings) -> bool:
    """Whether the hand-out goes by a rule (apps.feedback.services._claim_selected: selection,
    gold items, trust) rather than arrival order alone."""
    return feedback_cfg.gold_rate > 0 or selection_active(feedback_cfg.selection) or trust_handout(feedback_cfg)


@dataclass(frozen=True)
class Handout:
    """What the annotation queue may hand `annotator` now, as the claim decides it: the one
    definition behind both the claim (apps.feedback.services.assignment_claim) and the count
    of what waits for them (annotation_waiting), so a count above the queue's items always
    means a claim brings more ("117 waiting for you" beside an empty queue that "Load new
    items" could not fill: the count read the candidates, the claim its gold-only rule)."""

    fresh: QuerySet[Experience]  # the items it hands out, in its order (under a rule: no gold items)
    fresh_now: bool  # False: none of `fresh` for now (a new rater's first gold items; an untrusted one at share 0)
    gold: list[int]  # gold items never handed to them, when the rule hands them out (sorted)
    gold_ids: frozenset[int]  # every gold item of the run, under a rule
    gold_only: int  # under trust, gold items before any fresh one (a new rater: up to gold_first; untrusted: all)
    standing: str | None  # apps.feedback.reliability.rater_standing, where the hand-out follows it
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


def feedback_effect(*, run: Run, feedback: Feedback) -> str:
    """What a piece of feedback does, in the words the page, the API and the CLI all use. A
    label that arrives after its group trained (late) still teaches the run's reward model
    (apps.feedback.preferences takes late labels: the next version trains on them)."""
    kind = kind_get(feedback.kind)
    teaches = kind.labels and run.cfg.reward_model.enabled
    # Where the run never trains on the kind, the label says so and where it would count.
    refusal = kind_refusal(run=run, kind_name=feedback.kind)
    untrained = f"; not trained by this run: {refusal}" if refusal else ""
    if feedback.late and kind.reaches_training() != "expert":
        return ("late: teaches the reward model" if teaches else "late: kept for DPO, SFT and export") + untrained
    parts = []
    if kind.folds and run.cfg.feedback.mode != "auto":
        parts.append("moves its group's reward")
    if kind.reaches_training() == "expert" and refusal is None:
        parts.append("trains as an expert experience")
    if teaches:
        parts.append("teaches the reward model")
    return (" and ".join(parts) or "stored") + untrained


def late_words(*, run: Run, feedback: Feedback) -> str:
    """" (what it does)" for a late row, as the saved notes say it; "" otherwise."""
    if not feedback.late:
        return ""
    return f" ({feedback_effect(run=run, feedback=feedback)})"


def feedback_counts(*, run: Run) -> dict[str, int]:
    """Feedback of the run by kind (every registered kind, none given: 0), plus `late` (stored
    after its target was trained on) and `labels` (the label kinds: the ledger's total, which
    the annotation header shows beside the states)."""
    counts = dict.fromkeys(kind_names(), 0)
    counts["late"] = counts["labels"] = 0
    labels = set(kind_names(labels=True))
    # One query (the annotation header asks after every label and every 10 s).
    for row in Feedback.objects.filter(run=run).values("kind").annotate(n=Count("id"), late=Count("id", filter=Q(late=True))):
        counts[row["kind"]] = row["n"]
        counts["late"] += row["late"]
        if row["kind"] in labels:
            counts["labels"] += row["n"]
    return counts


@dataclass(frozen=True)
class DpoPair:
    feedback_id: int
    prompt: str
    chosen: str
    rejected: str
    chosen_id: int
    rejected_id: int
    late: bool


def _stated_preferences(rows: QuerySet[Feedback]) -> list[tuple[Feedback, int, int]]:
    """(row, better id, worse id) for each pair the rows state, through each row's kind
    (`preferred`: a pairwise tie states none), oldest row first."""
    ordered = rows.order_by("created_at", "id").only("kind", "experience_id", "other_id", "value", "late")
    return [(fb, better, worse) for fb in ordered for better, worse in kind_get(fb.kind).preferred(fb)]


def dpo_pairs(*, run: Run, include_late: bool = True) -> list[DpoPair]:
    """Preference pairs people stated, oldest first: every pair of each label whose kind
    reaches training as preferences (`preference_kind_names`: the A/B choices; a tie carries
    no preference). Late ones are included by default: DPO learns from them even when the
    GRPO step that used their completions is long past."""
    qs = Feedback.objects.effective().filter(run=run, kind__in=preference_kind_names())
    if not include_late:
        qs = qs.filter(late=False)
    stated = _stated_preferences(qs)
    ids = {pk for _, better, worse in stated for pk in (better, worse)}
    exps = Experience.objects.filter(pk__in=ids).only("pk", "prompt_text", "response_text").in_bulk() if ids else {}
    pairs = []
    for fb, better, worse in stated:
        chosen, rejected = exps.get(better), exps.get(worse)
        if chosen is None or rejected is None:
            continue
        pairs.append(DpoPair(
            feedback_id=fb.pk, prompt=chosen.prompt_text, chosen=chosen.response_text, rejected=rejected.response_text,
            chosen_id=chosen.pk, rejected_id=rejected.pk, late=fb.late,
        ))
    return pairs


def batch_feedback_metrics(*, rows: Sequence[Experience]) -> dict[str, float]:
    """How much of a trained batch people's feedback reached, as step metrics (`feedback/…`):
    the share of the model's own experiences that carry a human reward, their mean human
    reward, and the expert (corrected) experiences trained on. They go where every metric
    goes (the run page, its live event, the run's experiment trackers), so a team sees how
    many of the steps' rewards came from people, not only the label count."""
    own = [e for e in rows if not e.is_expert]
    rated = [e.human_reward for e in own if e.human_reward is not None]
    out = {"feedback/human_share": len(rated) / len(own) if own else 0.0,
           "feedback/expert": float(len(rows) - len(own))}
    if rated:
        out["feedback/human_reward_mean"] = sum(rated) / len(rated)
    return out


def preferences_among(*, run: Run, ids: list[int]) -> list[tuple[int, int]]:
    """(better id, worse id) of every pair people stated whose two experiences are both in
    `ids` (a preference algorithm's batch), oldest label first: the labels of the kinds that
    reach training as preferences (`preference_kind_names`), each pair as its kind's
    `preferred` states it (a pairwise tie carries none). Late labels count: the pair was
    stored, and the algorithm learns from it. One statement: the labels about the batch's
    experiences or of its groups (a label of a whole group names none of them itself).
    """
    wanted = set(ids)
    groups = Experience.objects.filter(run=run, pk__in=wanted).values("group_id")
    rows = Feedback.objects.effective().filter(Q(experience_id__in=wanted) | Q(group_id__in=groups), run=run,
                                               kind__in=preference_kind_names())
    return [(better, worse) for _, better, worse in _stated_preferences(rows) if better in wanted and worse in wanted]
