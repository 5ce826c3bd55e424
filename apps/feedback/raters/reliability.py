"""How far each rater can be trusted, measured from the run's own feedback.

- Agreement per run and question type: Krippendorff's alpha (the `krippendorff` package) over
  the rating matrix (raters x experiences, 1..5 scores, ordinal and interval; thumbs nominal);
  for comparisons and rankings, the rate at which two raters who judged the same pair agree.
  Which kinds count where is each kind's declaration (`FeedbackKind.agreement`: "rating" or
  "preference"), never its name.
- Per rater: how many labels, agreement with the consensus of the others (1 - 2 x mean
  absolute distance to the median of the others' ratings of the same item, so a rater answering at
  random scores about 0 and a perfect one 1), accuracy on gold items (1 - 2 x mean absolute
  error against the known answer), median seconds per item, and scale offset (how far their
  ratings sit above (+) or below (-) the others' on shared items, on the [0, 1] scale).
- Weights for the human fold (`feedback.rater_weighting`): off (all 1), gold or agreement.
  A measured figure is shrunk toward full trust by one pseudo-observation, so a new rater
  starts at weight 1 and a rater who answers at random falls toward 0 within a few items.
- Trust for the reward model (`rater_weights(..., earned=True)`): the same figure shrunk
  toward no trust instead, so a rater teaches the run's reward model only once measured. The
  fold's generous prior costs one group's reward; the reward model generalises whatever it is
  taught to every rollout, and a random rater lucky on 4 gold items (accuracy 0.375: fold
  weight 0.5, trusted) put 112 random pairs into bench/steering's noisy arm; earned, 0.3.

- Standing for the annotation queue (`feedback.trust`, apps.feedback.handout.rule): unmeasured
  (fewer gold items rated than `trust.gold_first`, at least one; under agreement weighting no
  shared item yet), trusted (earned trust at least the reward model's bar, TRUSTED_WEIGHT) or
  untrusted. An unmeasured annotator gets gold items first, an untrusted one gold items and
  only `trust.untrusted_share` of the fresh items.

Everything is on the normalised human scale [0, 1] (kernel.fold).
"""

from __future__ import annotations

import hashlib
import json
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from django.db.models import Count, Max, Sum

from apps.feedback.kinds import kind_get, kind_names, value_parse
from apps.feedback.models import Assignment, Feedback
from apps.rewards.models import GoldItem
from apps.runs.models import Run
from rftweb.degrade import cached
from kernel.jsontypes import Body

# Votes whose raters' weights add up to less than this count as no one's rating (the
# `learned` mode then uses the reward model for the member, and no rating pair is made
# for the reward model: apps.feedback.reward_model.preferences); a rater earning less is
# untrusted (rater_standing).
TRUSTED_WEIGHT = 0.5

PRIOR_WEIGHT = 1.0  # pseudo-observations of full trust before a rater's figures count


@dataclass
class RaterFigures:
    author_id: int
    username: str
    labels: int = 0
    agreement: float | None = None  # with the consensus of others, 0 (chance) .. 1
    agreement_items: int = 0
    gold_accuracy: float | None = None  # 0 (chance) .. 1
    gold_items: int = 0
    seconds_per_item: float | None = None
    scale_offset: float | None = None
    weight: float = 1.0
    # The weight the reward model's pairs use: earned by measurement (module docstring).
    earned: float = 1.0
    kinds: dict[str, int] = field(default_factory=dict)
    # unmeasured / trusted / untrusted (module docstring); None without rater weighting.
    standing: str | None = None

    def as_dict(self) -> Body:
        return {
            "rater": self.username, "labels": self.labels, "kinds": self.kinds,
            "agreement": self.agreement, "agreement_items": self.agreement_items,
            "gold_accuracy": self.gold_accuracy, "gold_items": self.gold_items,
            "seconds_per_item": self.seconds_per_item, "scale_offset": self.scale_offset, "weight": self.weight,
            "earned_weight": self.earned, "standing": self.standing,
        }


@runtime_checkable
class Rated(Protocol):
    """What the agreement reads of the value of a kind whose `agreement` is "rating"
    (apps.feedback.kinds.rating's, read through the registry: the kinds' modules stand above
    this one)."""

    normalised: float | None
    score: int | None
    thumb: str | None


def _latest_ratings(run: Run) -> dict[tuple[int, int], tuple[float, int | str | None]]:
    """(author, experience) -> (normalised value, score or thumb) of each rater's last rating
    (of the kinds whose `agreement` is "rating")."""
    out: dict[tuple[int, int], tuple[float, int | str | None]] = {}
    rows = (Feedback.objects.filter(run=run, kind__in=kind_names(agreement="rating"), author__isnull=False)
            .order_by("created_at", "id").values_list("author_id", "experience_id", "kind", "value"))
    for author, exp, kind, value in rows:
        rating = value_parse(kind=kind, raw=value)
        assert isinstance(rating, Rated)
        if rating.normalised is None:
            continue  # migration 0003's unreadable number: never folded, no rating to agree with
        out[(author, exp)] = (float(rating.normalised), rating.score if rating.score is not None else rating.thumb)
    return out


def _alpha(matrix: list[list[float]], level: str) -> float | None:
    import krippendorff
    import numpy as np

    data = np.array(matrix, dtype=float)
    # alpha needs at least one item judged by two raters and more than one value in all.
    if data.shape[0] < 2 or not (np.sum(~np.isnan(data), axis=0) >= 2).any():
        return None
    values = data[~np.isnan(data)]
    if len(set(values.tolist())) < 2:
        return None
    return float(krippendorff.alpha(reliability_data=data, level_of_measurement=level))  # type: ignore[arg-type]  # level is one of its names


def _matrix(cells: dict[tuple[int, int], float]) -> list[list[float]]:
    raters = sorted({a for a, _ in cells})
    units = sorted({u for _, u in cells})
    col = {u: j for j, u in enumerate(units)}
    matrix = [[float("nan")] * len(units) for _ in raters]
    for i, r in enumerate(raters):
        for (a, u), v in cells.items():
            if a == r:
                matrix[i][col[u]] = v
    return matrix


def _pair_verdicts(run: Run) -> dict[tuple[int, int], dict[int, int]]:
    """(lower id, higher id) -> {author: preferred id}, from the kinds whose `agreement` is
    "preference" (comparisons and rankings), each row's pairs as its kind states them."""
    verdicts: dict[tuple[int, int], dict[int, int]] = defaultdict(dict)
    rows = (Feedback.objects.filter(run=run, kind__in=kind_names(agreement="preference"), author__isnull=False)
            .order_by("created_at", "id").only("kind", "author_id", "experience_id", "other_id", "value"))
    for fb in rows:
        author = fb.author_id
        assert author is not None
        for better, worse in kind_get(fb.kind).preferred(fb):
            verdicts[(min(better, worse), max(better, worse))][author] = better
    return verdicts


def _pair_agreement(verdicts: dict[tuple[int, int], dict[int, int]]) -> tuple[float | None, int]:
    agree = total = 0
    for by_author in verdicts.values():
        picks = list(by_author.values())
        for i, x in enumerate(picks):
            for y in picks[i + 1:]:
                total += 1
                agree += x == y
    return (agree / total if total else None), total


def run_agreement(*, run: Run) -> dict[str, float | None]:
    """Agreement per question type: Krippendorff's alpha for ratings (1..5 scores ordinal and
    interval, thumbs nominal) and the agreement rate of rater pairs on comparisons/rankings."""
    ratings = _latest_ratings(run)
    scores = {k: float(raw) for k, (_, raw) in ratings.items() if isinstance(raw, int)}
    thumbs = {k: (1.0 if raw == "up" else 0.0) for k, (_, raw) in ratings.items() if isinstance(raw, str)}
    rate, pairs = _pair_agreement(_pair_verdicts(run))
    return {
        "rating_alpha_ordinal": _alpha(_matrix(scores), "ordinal") if scores else None,
        "rating_alpha_interval": _alpha(_matrix(scores), "interval") if scores else None,
        "thumb_alpha_nominal": _alpha(_matrix(thumbs), "nominal") if thumbs else None,
        "rated_items": len({u for _, u in ratings}), "raters": len({a for a, _ in ratings}),
        "pairwise_agreement": rate, "pairwise_rater_pairs": pairs,
    }


def _shrunk(value: float | None, n: int, *, prior: float = 1.0) -> float:
    """A measured figure (0 chance .. 1 perfect) on n items, pulled toward `prior` by
    PRIOR_WEIGHT pseudo-observations: full trust (1) for the fold, none (0) for the reward model."""
    if value is None or n == 0:
        return prior
    return max(0.0, (n * value + PRIOR_WEIGHT * prior) / (n + PRIOR_WEIGHT))


def rater_figures(*, run: Run, gold: dict[int, float] | None = None) -> list[RaterFigures]:
    """Per-rater figures of the run (see the module docstring); `gold` maps experience id to
    its known answer (default: the run's gold items)."""
    from django.contrib.auth import get_user_model

    if gold is None:
        gold = dict(GoldItem.objects.filter(run=run).values_list("experience_id", "answer"))
    ratings = _latest_ratings(run)
    by_unit: dict[int, dict[int, float]] = defaultdict(dict)
    for (author, unit), (value, _) in ratings.items():
        by_unit[unit][author] = value
    authors = set(Feedback.objects.filter(run=run, author__isnull=False).values_list("author_id", flat=True))
    names = dict(get_user_model().objects.filter(pk__in=authors).values_list("pk", "username"))
    figures = {a: RaterFigures(author_id=a, username=names.get(a, str(a))) for a in authors}
    for author, kind in Feedback.objects.filter(run=run, author__isnull=False).values_list("author_id", "kind"):
        f = figures[author]
        f.labels += 1
        f.kinds[kind] = f.kinds.get(kind, 0) + 1

    distances: dict[int, list[float]] = defaultdict(list)
    offsets: dict[int, list[float]] = defaultdict(list)
    gold_errors: dict[int, list[float]] = defaultdict(list)
    for unit, values in by_unit.items():
        if unit in gold:
            for author, v in values.items():
                gold_errors[author].append(abs(v - gold[unit]))
            continue  # gold answers are judged against the truth, not against each other
        if len(values) < 2:
            continue
        for author, v in values.items():
            others = [w for a, w in values.items() if a != author]
            # The median: one wild rater among the others cannot move a careful rater's consensus.
            consensus = statistics.median(others)
            distances[author].append(abs(v - consensus))
            offsets[author].append(v - consensus)
    # Comparisons and rankings: agreement with the others' majority on the same pair.
    pair_hits: dict[int, list[float]] = defaultdict(list)
    for by_author in _pair_verdicts(run).values():
        if len(by_author) < 2:
            continue
        for author, pick in by_author.items():
            others = [p for a, p in by_author.items() if a != author]
            same = sum(p == pick for p in others) / len(others)
            pair_hits[author].append(same)

    speeds: dict[int, list[float]] = defaultdict(list)
    for author, created, finished in (Assignment.objects.filter(run=run, status=Assignment.Status.DONE,
                                                                finished_at__isnull=False)
                                      .values_list("annotator_id", "created_at", "finished_at")):
        if finished is not None:  # filtered above; the ORM's type does not know it
            speeds[author].append((finished - created).total_seconds())

    mode = run.cfg.feedback.rater_weighting
    for author, f in figures.items():
        parts: list[tuple[float, int]] = []
        if distances[author]:
            parts.append((1 - 2 * statistics.fmean(distances[author]), len(distances[author])))
            f.scale_offset = statistics.fmean(offsets[author])
        if pair_hits[author]:
            # Two choices: agreeing by chance is 0.5, so 2 x rate - 1 puts chance at 0.
            parts.append((2 * statistics.fmean(pair_hits[author]) - 1, len(pair_hits[author])))
        if parts:
            n = sum(k for _, k in parts)
            f.agreement = max(-1.0, sum(v * k for v, k in parts) / n)
            f.agreement_items = n
        if gold_errors[author]:
            f.gold_items = len(gold_errors[author])
            f.gold_accuracy = 1 - 2 * statistics.fmean(gold_errors[author])
        if speeds[author]:
            f.seconds_per_item = statistics.median(speeds[author])
        if mode == "gold":
            f.weight = _shrunk(f.gold_accuracy, f.gold_items)
            f.earned = _shrunk(f.gold_accuracy, f.gold_items, prior=0.0)
        elif mode == "agreement":
            f.weight = _shrunk(f.agreement, f.agreement_items)
            f.earned = _shrunk(f.agreement, f.agreement_items, prior=0.0)
        f.standing = _standing(run, f)
    return sorted(figures.values(), key=lambda f: f.username)


def _standing(run: Run, f: RaterFigures) -> str | None:
    feedback_cfg = run.cfg.feedback
    if feedback_cfg.rater_weighting == "off":
        return None
    if feedback_cfg.rater_weighting == "gold":
        measured = f.gold_items >= max(1, feedback_cfg.trust.gold_first)
    else:
        measured = f.agreement_items >= 1
    if not measured:
        return "unmeasured"
    return "trusted" if f.earned >= TRUSTED_WEIGHT else "untrusted"


STANDINGS_CACHE_SECONDS = 600


def rater_standing(*, run: Run, annotator_id: int) -> str | None:
    """The annotator's standing for the hand-out (module docstring): "unmeasured" for one
    with no feedback yet, None when the run does not weight raters.

    Every claim asks, and the figures read all of the run's feedback: the standings are
    cached under what they are computed from (the run's feedback and gold items as of now,
    and its feedback settings), so a new label or gold item is a new key and never a stale one."""
    feedback_cfg = run.cfg.feedback
    if feedback_cfg.rater_weighting == "off":
        return None
    labels = Feedback.objects.filter(run=run).aggregate(n=Count("id"), last=Max("id"))
    gold = GoldItem.objects.filter(run=run).aggregate(n=Count("id"), last=Max("id"), answers=Sum("answer"))
    # The run's creation time too: a database rebuilt from scratch hands out the same ids again.
    basis = json.dumps([run.created_at, labels, gold, feedback_cfg.model_dump(mode="json")], sort_keys=True, default=str)
    key = f"rater-standings:{run.pk}:{hashlib.sha256(basis.encode()).hexdigest()[:32]}"
    # With Redis down the standings are computed afresh (rftweb/degrade.py).
    standings: dict[int, str | None] = cached(
        key, lambda: {f.author_id: f.standing for f in rater_figures(run=run)}, STANDINGS_CACHE_SECONDS)
    return standings.get(annotator_id, "unmeasured")


def rater_weights(*, run: Run, figures: Iterable[RaterFigures] | None = None,
                  earned: bool = False) -> dict[int, float] | None:
    """author id -> weight for the human fold (`earned`: for the reward model's pairs, trust
    only as far as measured), or None when the run weights raters equally."""
    if run.cfg.feedback.rater_weighting == "off":
        return None
    figures = rater_figures(run=run) if figures is None else figures
    return {f.author_id: f.earned if earned else f.weight for f in figures}


WEIGHTS_CACHE_SECONDS = 30
MIN_OFFSET_ITEMS = 3  # shared items before a rater's scale offset is trusted


def rater_offsets(*, run: Run, figures: Iterable[RaterFigures] | None = None) -> dict[int, float] | None:
    """author id -> scale offset to subtract before folding, or None when the run does not
    normalise raters. Only offsets measured on MIN_OFFSET_ITEMS shared items count."""
    if not run.cfg.feedback.normalise_raters:
        return None
    figures = rater_figures(run=run) if figures is None else figures
    return {f.author_id: f.scale_offset for f in figures
            if f.scale_offset is not None and f.agreement_items >= MIN_OFFSET_ITEMS}


def _per_rater_cached(key: str, compute: Callable[[], dict[int, float] | None]) -> dict[int, float]:
    """A rater id -> number map, computed at most every WEIGHTS_CACHE_SECONDS per key."""
    found = cached(key, lambda: compute() or {}, WEIGHTS_CACHE_SECONDS)
    return {int(k): float(v) for k, v in found.items()}


def rater_offsets_cached(*, run: Run) -> dict[int, float] | None:
    if not run.cfg.feedback.normalise_raters:
        return None
    return _per_rater_cached(f"rft:rater-offsets:{run.pk}", lambda: rater_offsets(run=run))


def rater_weights_cached(*, run: Run) -> dict[int, float] | None:
    """rater_weights, recomputed at most every WEIGHTS_CACHE_SECONDS per run: the fold runs
    on every submit, the figures read the whole run's feedback."""
    if run.cfg.feedback.rater_weighting == "off":
        return None
    return _per_rater_cached(f"rft:rater-weights:{run.pk}:{run.cfg.feedback.rater_weighting}",
                             lambda: rater_weights(run=run))
