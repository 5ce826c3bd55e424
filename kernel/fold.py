"""The fold: how automatic and human rewards become the final reward, as the run's feedback settings say.

`auto`: the reward functions decide; an experience is ready when written. Human feedback
is still stored and its mean kept in `human_reward` (for export, DPO and SFT), but the
training reward stays the automatic one.
`blend` / `human`: an experience waits (status pending) for human feedback, which the
fold takes in; a wait window in wall time ends with the settings' fallback.
`learned`: people's reward is folded as in `blend` where they rated; a member no one rated
gets `w_auto * auto_reward + w_rm * reward model score` (the score calibrated to the human
scale) once the run's reward model reaches `min_rm_accuracy` held-out accuracy, and its group
trains without waiting for people (apps/feedback/reward_model/versions.py); until then a group
waits for people as under `blend`, but only as long as a person could still label it in time:
`hold_seconds` while nobody holds it, while a person's hold lasts (`hold_cap_seconds` at most),
and never past `wait_seconds` (apps/feedback/handout/expiry.py, wait_window). People label a
sample there, so a group nobody picks up waits no longer than a person's grace.
Rater weights (`rater_weighting`, apps/feedback/raters/reliability.py) weight each rater's votes
in a member's mean.

The scale. Human votes are normalised to [0, 1]:
- a rating r on 1..5 counts (r - 1) / 4 (1 -> 0.0, 3 -> 0.5, 5 -> 1.0); thumbs up 1.0, down 0.0;
- a ranking of a group of n completions gives the member at 0-based position i (best first)
  the normalised Borda score (n - 1 - i) / (n - 1) (best 1.0, worst 0.0; a group of one: 1.0).
An experience's human reward is the mean of all its votes (every rating and every ranking
position it received, from every annotator). Reward functions are taken on their own scale
(the built-in ones return [0, 1]), and

    blend:  reward = w_auto * auto_reward + w_human * human_reward
            (a member without an automatic reward gets the human reward alone)
    human:  reward = human_reward

A member's human reward is final once `overlap` distinct annotators have given it a vote;
a group is trainable (pending -> ready) when every member's reward is final. When the wait
window (`wait_seconds` since a member was written; under `learned` see above) ends first, members that have some human
vote keep the fold of what they have, and the rest follow `fallback`: `auto` uses the
automatic reward, `drop` filters the whole group with a stated reason.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, TypedDict

from kernel.config import FeedbackSettings, RunConfig

RATING_MIN, RATING_MAX = 1, 5
DROP_REASON = "feedback: wait window ended without human rewards (fallback drop)"
# The one definition of "late": feedback whose target the trainer has already taken
# (leased or consumed) or that was dropped (filtered). Late feedback is stored and counted,
# kept for DPO, SFT and export, and never folded into a reward: the reward the trainer saw
# stays the reward the buffer shows.
LATE_STATUSES: tuple[str, ...] = ("leased", "consumed", "filtered")


def feedback_is_late(*, statuses: Iterable[str]) -> bool:
    """Whether feedback on targets in these statuses is late (any one taken is enough)."""
    return any(status in LATE_STATUSES for status in statuses)


class InitialFields(TypedDict):
    status: str
    auto_reward: float | None
    reward: float | None


def experience_initial_fields(*, cfg: RunConfig, auto_reward: float | None) -> InitialFields:
    """Status and reward fields for a freshly explored experience under the run's policy."""
    if cfg.feedback.mode == "auto":
        return {"status": "ready", "auto_reward": auto_reward, "reward": auto_reward}
    return {"status": "pending", "auto_reward": auto_reward, "reward": None}


def rating_normalise(*, score: int | None = None, thumb: str | None = None) -> float:
    """A 1..5 rating or a thumb on the [0, 1] scale."""
    if thumb is not None:
        if thumb not in ("up", "down"):
            raise ValueError(f"thumb must be 'up' or 'down', got {thumb!r}")
        return 1.0 if thumb == "up" else 0.0
    if isinstance(score, bool) or not isinstance(score, int) or not RATING_MIN <= score <= RATING_MAX:
        raise ValueError(f"a rating is a whole number from {RATING_MIN} to {RATING_MAX}, got {score!r}")
    return (score - RATING_MIN) / (RATING_MAX - RATING_MIN)


def borda_scores(order: Sequence[int]) -> dict[int, float]:
    """Normalised Borda: best first; position i of n scores (n - 1 - i) / (n - 1)."""
    n = len(order)
    if n == 1:
        return {order[0]: 1.0}
    return {member: (n - 1 - i) / (n - 1) for i, member in enumerate(order)}


def reward_combine(*, feedback_cfg: FeedbackSettings, auto: float | None, human: float | None) -> float | None:
    """The training reward from the two sources under the policy (None: not known yet).
    `learned` folds people's reward as `blend` does; members no one rated get
    `reward_learned` once a reward model scores them."""
    if feedback_cfg.mode == "auto":
        return auto
    if human is None:
        return None
    if feedback_cfg.mode == "human" or auto is None:
        return human
    return feedback_cfg.w_auto * auto + feedback_cfg.w_human * human


Rater = int | str | None  # a user id, "key:<id>" for an API key, None for neither


@dataclass
class MemberFold:
    """What the policy makes of one experience's human votes."""

    votes: list[tuple[Rater, float]] = field(default_factory=list)  # (rater, score)
    # Rater reliability weights (author id -> weight); a rater not named (an API key) weighs 1.
    weights: Mapping[int, float] | None = None

    def _weight(self, rater: Rater) -> float:
        if self.weights is None or not isinstance(rater, int):
            return 1.0
        return float(self.weights.get(rater, 1.0))

    @property
    def human(self) -> float | None:
        if not self.votes:
            return None
        total = sum(self._weight(a) for a, _ in self.votes)
        if total <= 0:
            # Every rater of this member weighs nothing: their plain mean, not no reward at all.
            return sum(score for _, score in self.votes) / len(self.votes)
        return sum(self._weight(a) * score for a, score in self.votes) / total

    @property
    def weight_total(self) -> float:
        """How much trust the votes carry together (each vote counts its rater's weight)."""
        return sum(self._weight(a) for a, _ in self.votes)

    @property
    def authors(self) -> int:
        # A person counts once, an API key counts once (one environment is one rater,
        # whichever door its votes came through); a vote with neither counts one.
        named = {a for a, _ in self.votes if a is not None}
        return len(named) + sum(1 for a, _ in self.votes if a is None)


def feedback_rater(feedback: object) -> Rater:
    """Who gave a piece of feedback, for counting distinct raters."""
    author = getattr(feedback, "author_id", None)
    if author is not None:
        return int(author)
    key = getattr(feedback, "api_key_id", None)
    if key is not None:
        return f"key:{key}"
    return None


# What one row of a kind of feedback contributes to its members' human rewards: (experience
# id, score on [0, 1], whether the rater's scale offset applies: it does to a rater's own
# scale, as a rating is, not to a position in an order).
Vote = tuple[int, float, bool]


class RaterVote(NamedTuple):
    """One human vote on one member, with its rater, as plain data: what the fold reads
    (apps.feedback.kinds turns each row of a folding kind into these; the math below is the
    same for all kinds)."""

    experience_id: int
    score: float  # on [0, 1]
    # Whether the rater's scale offset applies: it does to a rater's own scale, as a rating
    # is, not to a position in an order.
    scaled: bool
    rater: Rater  # who gave it, for counting distinct raters (feedback_rater)
    author: int | None  # the person, whose scale offset applies


def votes_fold(
    *, member_ids: Iterable[int], votes: Iterable[RaterVote], weights: Mapping[int, float] | None = None,
    offsets: Mapping[int, float] | None = None,
) -> dict[int, MemberFold]:
    """Fold the human votes of a group's members; votes on other experiences are passed
    over. `weights` are the raters' reliability weights (apps.feedback.raters.reliability), None
    for equal weights; `offsets` their scale offsets, subtracted from their scaled votes
    (ratings; clamped to [0, 1]) before folding."""
    folds = {pk: MemberFold(weights=weights) for pk in member_ids}
    for vote in votes:
        fold = folds.get(vote.experience_id)
        if fold is None:
            continue
        score, author = vote.score, vote.author
        if vote.scaled and offsets and author is not None and author in offsets:
            score = min(1.0, max(0.0, score - offsets[author]))
        fold.votes.append((vote.rater, score))
    return folds


def reward_learned(*, feedback_cfg: FeedbackSettings, auto: float | None, rm: float) -> float:
    """`learned`, a member no person rated: w_auto * automatic reward + w_rm * the reward
    model's score (a member without an automatic reward gets the score's part alone)."""
    return (feedback_cfg.w_auto * auto if auto is not None else 0.0) + feedback_cfg.w_rm * rm


def member_is_final(*, feedback_cfg: FeedbackSettings, fold: MemberFold) -> bool:
    if feedback_cfg.mode == "auto":
        return True
    return fold.authors >= feedback_cfg.overlap
