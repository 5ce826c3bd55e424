"""Preference pairs from every kind of human feedback: what the reward model learns from and
what the preference export writes (TRL's prompt / chosen / rejected format).

- ratings: within one group (the completions of one prompt), a member whose human reward
  (the mean of its ratings, each rater weighted by reliability when the run says so) is
  higher is preferred over one whose is lower; equal rewards give no pair;
- rankings: every ordered pair of one ranking (best first), per ranking;
- pairwise: the winner over the loser; a tie gives no pair;
- edits: the corrected text (an expert experience) over the original it corrects.

Each pair keeps its prompt and the group it came from; held-out splits keep a whole prompt
out of training (`pair_is_heldout`), every group of it.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from apps.buffer.models import Experience
from apps.feedback.kinds import feedback_votes, kind_get, kind_names, preference_pair
from apps.feedback.models import Feedback
from apps.feedback.raters.reliability import TRUSTED_WEIGHT
from apps.rewards.pairs import PreferencePair
from kernel.fold import votes_fold
from apps.runs.models import Run
from kernel.jsontypes import Body


def _author_trust(fb: Feedback, weights: Mapping[int, float] | None) -> float:
    """A choice's, ranking's or edit's trust: its author's weight (1 for an API key, as in the fold)."""
    if weights is None or fb.author_id is None:
        return 1.0
    return float(weights.get(fb.author_id, 1.0))


# Why a label made no preference pair (PairsRead.unpaired), in the ledger's words
# (apps.feedback.ledger.REASON_WORDS).
UNPAIRED_REASONS = ("lone", "gold", "untrusted", "no_pair")


@dataclass(frozen=True)
class PairsRead:
    """The pairs the run's feedback implies, and why each label that made none did not
    (feedback id -> a reason of UNPAIRED_REASONS): what a reward-model version records."""

    pairs: list[PreferencePair]
    unpaired: dict[int, str]


def preference_pairs(
    *, run: Run, include_late: bool = True, rater_weights: Mapping[int, float] | None = None,
    rater_offsets: Mapping[int, float] | None = None, exclude_experience_ids: set[int] | None = None,
) -> list[PreferencePair]:
    """Every preference pair the run's feedback implies, oldest feedback first (see
    `preference_pairs_read`, which also says why a label made none)."""
    return preference_pairs_read(run=run, include_late=include_late, rater_weights=rater_weights,
                                 rater_offsets=rater_offsets, exclude_experience_ids=exclude_experience_ids).pairs


def preference_pairs_read(
    *, run: Run, include_late: bool = True, rater_weights: Mapping[int, float] | None = None,
    rater_offsets: Mapping[int, float] | None = None, exclude_experience_ids: set[int] | None = None,
) -> PairsRead:
    """Every preference pair the run's feedback implies, oldest feedback first, each with the
    labels it came from (`PreferencePair.feedback_ids`), and why each other label made none.

    Late feedback (stored after its target was trained on) still says what people prefer,
    so it is included unless `include_late` is False. `rater_weights` (author id -> weight)
    weights each rater's ratings in a member's mean, `rater_offsets` shifts each rater's scale
    (apps.feedback.raters.reliability). With weights, every pair records its trust
    (`PreferencePair.trust`) and a pair trusted less than TRUSTED_WEIGHT is left out, whatever
    kind of feedback it came from: a rater who answers at random teaches the reward model
    nothing through ratings, choices, rankings or edits alike ("untrusted"). Gold items are left
    out by passing their ids in `exclude_experience_ids`, so a rater's gold answers teach nothing
    twice ("gold"). A rating whose member no other trusted rating in its group can be compared
    with makes no pair ("lone"); a tie or a correction that changed nothing neither ("no_pair").
    A label the run's owner rejected (apps.feedback.review.services) yields no pair and is not read.
    """
    skip = exclude_experience_ids or set()
    qs = Feedback.objects.effective().filter(run=run, kind__in=kind_names(labels=True))
    if not include_late:
        qs = qs.filter(late=False)
    rows = list(qs.order_by("created_at", "id").only("kind", "experience_id", "other_id", "group_id", "author_id",
                                                      "value"))
    wanted: set[int] = set()
    for fb in rows:
        wanted.update(kind_get(fb.kind).pair_ids(fb))
    exps = {e.pk: e for e in Experience.objects.filter(run=run, pk__in=wanted - skip).only(
        "pk", "group_id", "prompt_text", "response_text")}

    pairs: list[PreferencePair] = []
    unpaired: dict[int, str] = {}
    # Kinds whose pairs come from the group's folded rewards (ratings), by (kind, group).
    ratings_by_group: dict[tuple[str, str], list[Feedback]] = defaultdict(list)
    for fb in rows:
        kind = kind_get(fb.kind)
        trust = _author_trust(fb, rater_weights)
        if kind.pairs_by_fold:
            if fb.experience_id in exps:
                ratings_by_group[(kind.name, exps[fb.experience_id].group_id)].append(fb)
            else:
                unpaired[fb.pk] = "gold" if fb.experience_id in skip else "no_pair"
            continue
        if trust < TRUSTED_WEIGHT:
            unpaired[fb.pk] = "untrusted"  # an untrusted rater's choice is not evidence (ratings: per member)
            continue
        made = kind.pairs(fb, exps, trust=trust)
        if not made:
            unpaired[fb.pk] = "gold" if skip.intersection(kind.pair_ids(fb)) else "no_pair"
        pairs.extend(replace(p, feedback_ids=(fb.pk,)) for p in made)

    for (kind_name, group_id), ratings in ratings_by_group.items():
        made, trusted = _rating_pairs(kind_name, group_id, ratings, exps, rater_weights=rater_weights,
                                      rater_offsets=rater_offsets)
        pairs.extend(made)
        paired = {pk for p in made for pk in p.feedback_ids}
        for fb in ratings:
            if fb.pk not in paired:
                unpaired[fb.pk] = _rating_unpaired(fb, trusted, rater_weights=rater_weights)
    return PairsRead(pairs=pairs, unpaired=unpaired)


def _rating_pairs(kind_name: str, group_id: str, ratings: list[Feedback], exps: Mapping[int, Experience], *,
                  rater_weights: Mapping[int, float] | None,
                  rater_offsets: Mapping[int, float] | None) -> tuple[list[PreferencePair], set[int]]:
    """One group's rating pairs: every two trusted members whose human rewards differ, each
    pair naming the ratings of both members that entered their rewards (a rater weighing
    nothing entered none); and the trusted members (those whose raters' weights add up to at
    least TRUSTED_WEIGHT)."""
    member_ids = sorted({fb.experience_id for fb in ratings if fb.experience_id is not None})
    folds = votes_fold(member_ids=member_ids, votes=feedback_votes(ratings), weights=rater_weights,
                       offsets=rater_offsets)
    by_member: dict[int, list[int]] = defaultdict(list)
    for fb in ratings:
        if fb.experience_id is not None and (rater_weights is None or _author_trust(fb, rater_weights) > 0):
            by_member[fb.experience_id].append(fb.pk)
    # A member only untrusted raters rated teaches nothing: its rating is not evidence.
    humans: list[tuple[int, float, float]] = []
    for pk in member_ids:
        human = folds[pk].human
        if human is not None and folds[pk].weight_total >= TRUSTED_WEIGHT:
            humans.append((pk, human, folds[pk].weight_total if rater_weights is not None else 1.0))
    pairs: list[PreferencePair] = []
    for i, (pk_a, h_a, t_a) in enumerate(humans):
        for pk_b, h_b, t_b in humans[i + 1:]:
            if h_a == h_b:
                continue
            (hi, h_hi), (lo, h_lo) = ((pk_a, h_a), (pk_b, h_b)) if h_a > h_b else ((pk_b, h_b), (pk_a, h_a))
            pair = preference_pair(exps[hi], exps[lo], kind=kind_name, margin=float(h_hi - h_lo),
                                   group_id=group_id, trust=min(t_a, t_b))
            pairs.append(replace(pair, feedback_ids=tuple(sorted(by_member[hi] + by_member[lo]))))
    return pairs, {pk for pk, _, _ in humans}


def _rating_unpaired(fb: Feedback, trusted: set[int], *, rater_weights: Mapping[int, float] | None) -> str:
    """Why a rating entered no pair of its group: its rater or its member is not trusted,
    its member was the only one trusted raters rated, or its member ties the rest."""
    if rater_weights is not None and _author_trust(fb, rater_weights) <= 0:
        return "untrusted"
    if fb.experience_id not in trusted:
        return "untrusted" if rater_weights is not None else "no_pair"
    return "lone" if len(trusted) < 2 else "no_pair"


@dataclass(frozen=True)
class PairLabels:
    """What a reward-model version records of the labels it read (RewardModel.trained_on,
    held_out, unpaired): the labels its training pairs came from, those whose every pair it
    held out for its evaluation, and why each other one made no pair ({reason: [ids]})."""

    trained_on: list[int]
    held_out: list[int]
    unpaired: dict[str, list[int]]


def pair_labels(*, train: Iterable[PreferencePair], heldout: Iterable[PreferencePair],
                unpaired: Mapping[int, str]) -> PairLabels:
    """The labels of a version's training and held-out pairs (a label in both, as in a
    cross-validated fit, trained it), and the others' reasons."""
    trained = {pk for p in train for pk in p.feedback_ids}
    held = {pk for p in heldout for pk in p.feedback_ids} - trained
    by_reason: dict[str, list[int]] = defaultdict(list)
    for pk, reason in sorted(unpaired.items()):
        if pk not in trained and pk not in held:
            by_reason[reason].append(pk)
    return PairLabels(trained_on=sorted(trained), held_out=sorted(held), unpaired=dict(by_reason))


def prompt_is_heldout(prompt: str, *, share: float, seed: int = 0) -> bool:
    """Deterministic split by prompt text: all pairs of a prompt are held out or all trained
    on, whichever group (attempt) of the task they came from, so held-out accuracy measures
    prompts the reward model never saw. (A task explored again makes a new group with the
    same prompt: a split by group would train on the prompt and measure on it too.)"""
    digest = hashlib.sha256(f"{seed}:{prompt}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < share


def pair_is_heldout(pair: PreferencePair, *, share: float, seed: int = 0) -> bool:
    return prompt_is_heldout(pair.prompt, share=share, seed=seed)


def preference_rows_trl(pairs: list[PreferencePair]) -> list[Body]:
    """TRL's explicit-prompt preference format (DPOTrainer, RewardTrainer): prompt, chosen,
    rejected, plus `margin` (RewardTrainer reads it when present) and where the pair came from."""
    return [{"prompt": p.prompt, "chosen": p.chosen, "rejected": p.rejected, "margin": p.margin,
             "kind": p.kind, "chosen_id": p.chosen_id, "rejected_id": p.rejected_id} for p in pairs]


