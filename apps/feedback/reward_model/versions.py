"""The run's learned reward model, web side (no torch): when a new version is due, publishing
a version, which experiences it should score, and folding its scores into rewards under the
`learned` feedback policy.

Training and scoring themselves run on the `reward` queue (workers/reward/trainer.py).

`learned` in short: a member no person rated gets w_auto * auto + w_rm * calibrated score;
a member people rated gets the `blend` fold of their reward; a group is trainable once every
member has a reward, so groups never wait for people. Until a version's held-out accuracy
is at least `feedback.min_rm_accuracy` with `feedback.rm_accuracy_confidence` confidence,
nothing is scored into rewards and the run behaves as `blend` (groups wait for people, then
the wait window's fallback), its window bounded by people's holds (a group nobody holds waits
`hold_seconds`: apps.feedback.handout.expiry.wait_window); under `feedback.rm_gate: evidence` the version scores from when
that bound is above chance, its scores weighted by how far the bound has come
(`reward_model_weight`); under `calibrated` from then on at the calibration's own scale.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from datetime import timedelta
from statistics import NormalDist
from typing import TypedDict

from django.db import connection, transaction
from django.db.models import Exists, OuterRef, QuerySet

from apps.buffer.models import Experience
from apps.feedback.kinds import feedback_votes, kind_names
from apps.feedback.models import Feedback, LabelTaught
from apps.feedback.reward_model.preferences import PairLabels
from apps.feedback.raters.reliability import TRUSTED_WEIGHT, rater_offsets_cached, rater_weights_cached
# The fold's public names, under the local names this module's code calls them by.
from apps.feedback.kinds.fold import group_feedback as _group_feedback
from apps.feedback.kinds.fold import group_fold
from apps.feedback.kinds.fold import group_members_locked as _locked_members
from apps.rewards.models import GoldItem, RewardModel, RewardModelScore
from apps.rewards.services import scorer_publish
from kernel.fold import reward_learned, votes_fold
from apps.runs.events import labels_changed_publish
from apps.runs.models import Run

log = logging.getLogger(__name__)

_OPEN = (Experience.Status.PENDING, Experience.Status.READY)
ACCURACY_METRIC = "reward_model/accuracy"
ACCURACY_RANDOM_METRIC = "reward_model/accuracy_random"  # the unbiased twin: pairs the random share handed out


def reward_model_on(*, run: Run) -> bool:
    return run.cfg.reward_model.enabled


def run_label_count(*, run: Run) -> int:
    """Labels that teach the reward model: ratings, rankings, comparisons and edits."""
    return Feedback.objects.effective().filter(run=run, kind__in=kind_names(labels=True)).count()


def reward_model_latest(*, run: Run) -> RewardModel | None:
    return RewardModel.objects.filter(run=run).order_by("-version").first()


def accuracy_lower_bound(*, accuracy: float, pairs: int, confidence: float) -> float:
    """One-sided Wilson score lower bound of a pairwise accuracy measured on `pairs` pairs:
    the true accuracy is at least this with probability `confidence` (0.5: the accuracy
    itself). Wilson rather than the normal approximation because the interesting accuracies
    sit near 1 on few pairs, where p ± z·sqrt(p(1-p)/n) collapses to p. Pairs of one held-out
    prompt share completions, so they are not quite independent: the bound is optimistic by
    that much, which the default confidence (95%) leaves room for."""
    if pairs <= 0:
        return 0.0
    if confidence <= 0.5:
        return accuracy
    z = NormalDist().inv_cdf(confidence)
    n = float(pairs)
    p = min(1.0, max(0.0, accuracy))
    centre = p + z * z / (2 * n)
    spread = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, (centre - spread) / (1 + z * z / n))


def reward_model_lower_bound(*, run: Run, rm: RewardModel) -> float | None:
    """The accuracy `rm` has at least, at the run's `rm_accuracy_confidence` (None: no held-out pairs)."""
    if rm.accuracy is None or not rm.pairs_heldout:
        return None
    return accuracy_lower_bound(accuracy=rm.accuracy, pairs=rm.pairs_heldout,
                                confidence=run.cfg.feedback.rm_accuracy_confidence)


# A pairwise accuracy no better than this is a coin's: the `evidence` gate's floor.
CHANCE = 0.5


def reward_model_usable(*, run: Run) -> RewardModel | None:
    """The newest version good enough to score rewards, or None: `learned` then falls back
    as `blend`. Good enough: the lower confidence bound of its held-out accuracy
    (`accuracy_lower_bound` at `rm_accuracy_confidence`) reaches `min_rm_accuracy` (gate
    `bound`) or is above chance (gate `evidence`, weighted by `reward_model_weight`), on at
    least `min_rm_heldout_pairs` pairs."""
    latest = reward_model_latest(run=run)
    return latest if latest is not None and reward_model_gate_open(run=run, rm=latest) else None


def reward_model_gate_open(*, run: Run, rm: RewardModel) -> bool:
    """Whether the run's gate lets version `rm` score rewards while it is the newest (what
    `reward_model_usable` asks of the newest; a probe asks it of earlier ones)."""
    feedback_cfg = run.cfg.feedback
    if rm.pairs_heldout < feedback_cfg.min_rm_heldout_pairs:
        return False
    bound = reward_model_lower_bound(run=run, rm=rm)
    if bound is None:
        return False
    if feedback_cfg.rm_gate == "calibrated" or (feedback_cfg.rm_gate == "evidence"
                                                 and feedback_cfg.min_rm_accuracy > CHANCE):
        return bound > CHANCE
    return bound >= feedback_cfg.min_rm_accuracy


def reward_model_weight(*, run: Run, rm: RewardModel) -> float:
    """How much of a usable version's calibrated score a reward carries: 1 under the `bound`
    and `calibrated` gates; under `evidence` the share of the way from chance to
    `min_rm_accuracy` its lower bound has come (full from there on)."""
    feedback_cfg = run.cfg.feedback
    if feedback_cfg.rm_gate != "evidence" or feedback_cfg.min_rm_accuracy <= CHANCE:
        return 1.0
    bound = reward_model_lower_bound(run=run, rm=rm) or 0.0
    return min(1.0, max(0.0, (bound - CHANCE) / (feedback_cfg.min_rm_accuracy - CHANCE)))


def rm_reward_score(*, rm: RewardModel, score: float, weight: float) -> float:
    """A raw score as the reward fold takes it: calibrated to the human scale [0, 1], then drawn
    toward the scale's middle by what the gate has not yet seen shown (`weight` 1: as calibrated).
    Within a group only differences train (GRPO), so a weight w scales the reward model's part
    of every advantage by w."""
    calibrated = rm.calibrated(score)
    return calibrated if weight >= 1.0 else 0.5 + weight * (calibrated - 0.5)


# How long before a version's publication its data may have been read: its training time
# (`seconds`) and, before that, the read of its pairs. A rejection within it counts as after.
_READ_MARGIN = timedelta(seconds=60)


def reward_model_due(*, run: Run) -> bool:
    """A new version is due when `retrain_every` labels came in since the last one, or when
    the owner rejected a label after the last one read its data: that version still scores
    by what the label taught (and, rejections taking labels away, the count alone would put
    the next version further off, not nearer)."""
    if not reward_model_on(run=run):
        return False
    latest = reward_model_latest(run=run)
    seen = latest.labels if latest is not None else 0
    if run_label_count(run=run) - seen >= run.cfg.reward_model.retrain_every:
        return True
    if latest is None:
        return False
    read_at = latest.created_at - timedelta(seconds=latest.seconds) - _READ_MARGIN
    return Feedback.objects.filter(run=run, kind__in=kind_names(labels=True), review=Feedback.Review.REJECTED,
                                   reviewed_at__gte=read_at).exists()


def reward_model_publish(
    *, run: Run, path: str, base: str, accuracy: float | None, pairs_train: int, pairs_heldout: int,
    labels: int, seconds: float, scale: float = 1.0, offset: float = 0.5, accuracy_random: float | None = None,
    pairs_random: int | None = None, pair_labels: PairLabels | None = None,
) -> RewardModel:
    """Record a trained reward model as the run's next version and announce it (with its
    unbiased accuracy on the random / arrival share, RewardModel.accuracy_random), and which
    labels its training and held-out pairs came from (`pair_labels`, written with the row:
    what the ledger says each label taught)."""
    recorded = pair_labels or PairLabels(trained_on=[], held_out=[], unpaired={})
    with transaction.atomic():
        rm = _publish(run=run, path=path, base=base, accuracy=accuracy, pairs_train=pairs_train,
                      pairs_heldout=pairs_heldout, labels=labels, seconds=seconds, scale=scale, offset=offset,
                      accuracy_random=accuracy_random, pairs_random=pairs_random, recorded=recorded)
        label_taught_record(run=run, rm=rm)
        # What it learned from moves labels to "taught the reward model" (apps.feedback.ledger).
        labels_changed_publish(run_id=run.pk, why="reward_model")
    return rm


def _publish(*, run: Run, path: str, base: str, accuracy: float | None, pairs_train: int, pairs_heldout: int,
             labels: int, seconds: float, scale: float, offset: float, accuracy_random: float | None,
             pairs_random: int | None, recorded: PairLabels) -> RewardModel:
    rm: RewardModel = scorer_publish(
        model=RewardModel, run=run, metric=ACCURACY_METRIC, accuracy=accuracy,
        more_metrics={ACCURACY_RANDOM_METRIC: accuracy_random}, path=path, base=base,
        pairs_train=pairs_train, pairs_heldout=pairs_heldout, labels=labels, seconds=seconds, scale=scale, offset=offset,
        accuracy_random=accuracy_random, pairs_random=pairs_random, trained_on=recorded.trained_on,
        held_out=recorded.held_out, unpaired=recorded.unpaired,
    )
    return rm


# One statement per version: each label it read gets its first teaching version (kept once
# set) and this version's reason it made no pair ("" where it trained on it). Labels deleted
# since the version read them are passed over (the join).
_LABEL_TAUGHT_SQL = """
INSERT INTO {table} AS t (feedback_id, run_id, taught, reason, version)
SELECT u.fid, %(run)s, CASE WHEN u.reason = '' THEN %(version)s END, u.reason, %(version)s
FROM unnest(%(ids)s::bigint[], %(reasons)s::text[]) AS u(fid, reason) JOIN {feedback} f ON f.id = u.fid
ON CONFLICT (feedback_id) DO UPDATE SET
    taught = COALESCE(t.taught, EXCLUDED.taught), reason = EXCLUDED.reason, version = EXCLUDED.version
    WHERE t.version <= EXCLUDED.version
"""


def label_taught_record(*, run: Run, rm: RewardModel) -> int:
    """Keep, per label, what version `rm` recorded of it (LabelTaught: what the ledger reads).
    Returns how many labels it wrote."""
    why = {pk: "" for pk in rm.trained_on}
    why.update({pk: "heldout" for pk in rm.held_out})
    why.update({pk: reason for reason, ids in rm.unpaired.items() for pk in ids})
    if not why:
        return 0
    ids = sorted(why)
    sql = _LABEL_TAUGHT_SQL.format(table=LabelTaught._meta.db_table, feedback=Feedback._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(sql, {"run": run.pk, "version": rm.version, "ids": ids, "reasons": [why[pk] for pk in ids]})
        return int(cursor.rowcount)


def experiences_to_score(*, run: Run, rm: RewardModel, limit: int) -> QuerySet[Experience]:
    """Open experiences no person rated (with rater weighting on: every open one) that this
    version has not scored yet and whose automatic reward is complete, oldest first."""
    scored = RewardModelScore.objects.filter(experience=OuterRef("pk"), reward_model=rm)
    qs = Experience.objects.filter(run=run, is_expert=False, status__in=_OPEN)
    if run.cfg.feedback.rater_weighting == "off":
        qs = qs.filter(human_reward__isnull=True)
    # else rated ones too: a member only untrusted raters rated is the reward model's to score.
    return (
        qs.exclude(Exists(scored))
        .exclude(metadata__awaiting_rewards__0__isnull=False)
        .order_by("id")[:limit]
    )


def rm_scores_apply(*, run: Run, rm: RewardModel, scores: Mapping[int, float],
                    spreads: Mapping[int, float] | None = None) -> int:
    """Store a version's scores (idempotent: a score already stored stays), each with its
    spread where the kind has one (an ensemble's disagreement, RewardModelScore.spread), and,
    under the `learned` policy with a usable version, fold them into the groups they touch.
    Returns how many groups became trainable."""
    spreads = spreads or {}
    RewardModelScore.objects.bulk_create(
        [RewardModelScore(experience_id=pk, reward_model=rm, score=float(s),
                          spread=None if spreads.get(pk) is None else float(spreads[pk])) for pk, s in scores.items()],
        ignore_conflicts=True,
    )
    if run.cfg.feedback.mode != "learned":
        return 0
    usable = reward_model_usable(run=run)
    if usable is None or usable.pk != rm.pk:
        return 0
    groups = set(Experience.objects.filter(run=run, pk__in=list(scores)).values_list("group_id", flat=True))
    return sum(learned_group_fold(run=run, group_id=g, rm=rm) for g in sorted(groups))


def learned_group_fold(*, run: Run, group_id: str, rm: RewardModel) -> bool:
    """`learned`: people's reward where they rated (the blend fold), the reward model's where
    no one did; the group becomes trainable when every open member has a reward. Returns
    whether it did."""

    feedback_cfg = run.cfg.feedback
    with transaction.atomic():
        members = _locked_members(run=run, group_id=group_id)
        group_fold(run=run, group_id=group_id, members=members)
        ids = [m.pk for m in members]
        weights = rater_weights_cached(run=run)
        rows = _group_feedback(run=run, group_id=group_id, member_ids=ids)
        folds = votes_fold(member_ids=ids, votes=feedback_votes(rows), weights=weights,
                             offsets=rater_offsets_cached(run=run))
        scores = dict(RewardModelScore.objects.filter(reward_model=rm, experience_id__in=ids)
                      .values_list("experience_id", "score"))
        pending = [m for m in members if m.status == Experience.Status.PENDING]
        if not pending:
            return False
        weight = reward_model_weight(run=run, rm=rm)
        for m in pending:
            # Rated only by raters the run does not trust: the reward model decides instead.
            untrusted = weights is not None and folds[m.pk].weight_total < TRUSTED_WEIGHT
            if (m.human_reward is None or untrusted) and m.pk in scores:
                reward = reward_learned(feedback_cfg=feedback_cfg, auto=m.auto_reward,
                                        rm=rm_reward_score(rm=rm, score=scores[m.pk], weight=weight))
                Experience.objects.filter(pk=m.pk).update(reward=reward)
                m.reward = reward
        if any(m.reward is None or (m.metadata or {}).get("awaiting_rewards") for m in pending):
            return False
        return bool(Experience.objects.filter(pk__in=[m.pk for m in pending], status=Experience.Status.PENDING)
                    .update(status=Experience.Status.READY))


def gold_experience_ids(*, run: Run) -> set[int]:
    return set(GoldItem.objects.filter(run=run).values_list("experience_id", flat=True))


class RewardModelSummary(TypedDict):
    latest_bound: float | None
    gate: str  # feedback.rm_gate
    opens_at: float  # the bound at which the gate opens: min_rm_accuracy (`bound`) or chance, above which it opens
    weight: float | None  # the share of its calibrated score the version in use carries (None: none in use)
    confidence: float
    enabled: bool
    versions: list[RewardModel]
    latest: RewardModel | None
    in_use: RewardModel | None
    labels: int
    mode: str
    w_auto: float
    w_rm: float
    w_human: float
    min_accuracy: float
    min_heldout_pairs: int
    retrain_every: int
    kind: str
    base: str
    scored: int


def reward_model_summary(*, run: Run) -> RewardModelSummary:
    """What the run page shows: versions with their held-out accuracy, the one in use, the
    labels so far and the weights of the learned policy."""
    versions = list(RewardModel.objects.filter(run=run).order_by("-version")[:10])
    usable = reward_model_usable(run=run)
    feedback_cfg = run.cfg.feedback
    return {
        "latest_bound": reward_model_lower_bound(run=run, rm=versions[0]) if versions else None,
        "gate": feedback_cfg.rm_gate,
        "opens_at": feedback_cfg.min_rm_accuracy if feedback_cfg.rm_gate == "bound" else CHANCE,
        "weight": reward_model_weight(run=run, rm=usable) if usable is not None else None,
        "confidence": feedback_cfg.rm_accuracy_confidence,
        "enabled": reward_model_on(run=run), "versions": versions, "latest": versions[0] if versions else None,
        "in_use": usable, "labels": run_label_count(run=run), "mode": feedback_cfg.mode,
        "w_auto": feedback_cfg.w_auto, "w_rm": feedback_cfg.w_rm, "w_human": feedback_cfg.w_human,
        "min_accuracy": feedback_cfg.min_rm_accuracy, "min_heldout_pairs": feedback_cfg.min_rm_heldout_pairs,
        "retrain_every": run.cfg.reward_model.retrain_every, "kind": run.cfg.reward_model.kind,
        "base": run.cfg.reward_model.base,
        "scored": RewardModelScore.objects.filter(reward_model__run=run).count(),
    }
