"""The figures of a blind side-by-side evaluation (apps/evaluation), from its vote rows alone.

No Django: a vote is a `PairVote` (the item it is on, the versions shown left and right, the
choice, who voted, whether the item was a planted check), and every figure is a function of
a list of them, so a bench or a test recomputes it without a database.

Counting rules (docs/guide/blind-evaluation.md):
- a win counts 1, a tie and "both bad" count half to each side (neither answer was preferred);
- planted checks (the same answer on both sides) never count toward a version's figures: they
  measure the voter (`check_flags`);
- win rates carry a 95% Wilson score interval; an interval that contains 0.5 reads "too few
  votes to tell";
- Bradley–Terry strengths are fitted by Hunter's MM iteration with a small symmetric prior on
  every compared pair (so a version that never lost has a finite score), reported as the log
  of the strength over the baseline's, with a seeded bootstrap over votes for the interval;
- agreement with the majority is leave-one-out: a vote agrees when it equals the strict
  plurality of the *other* votes on the same item (items where the others tie are skipped).
"""

from __future__ import annotations

import math
import random
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

LEFT, RIGHT, TIE, BOTH_BAD = "left", "right", "tie", "both_bad"
CHOICES = (LEFT, RIGHT, TIE, BOTH_BAD)
# The normal quantile of a two-sided 95% interval.
Z95 = 1.959963984540054
# The half-width a team usually asks of a win rate, and the votes it takes (votes_for_margin).
MARGIN = 0.1
# A voter is flagged when at least this share of their planted checks picked a side, over
# at least CHECKS_MIN checks (one slip is not "often").
CHECK_SIDE_SHARE = 0.5
CHECKS_MIN = 2
# Pseudo-wins added each way on every compared pair of the Bradley–Terry fit.
BT_PRIOR = 0.5
BT_ITERATIONS = 500
BOOTSTRAP_ROUNDS = 200


@dataclass(frozen=True)
class PairVote:
    item: int
    left: str
    right: str
    choice: str
    voter: str
    check: bool = False


@dataclass(frozen=True)
class Interval:
    low: float
    high: float

    @property
    def undecided(self) -> bool:
        """The interval holds 0.5: the votes cannot tell the two sides apart."""
        return self.low <= 0.5 <= self.high


@dataclass(frozen=True)
class WinRate:
    version: str
    baseline: str
    votes: int
    wins: float
    rate: float
    interval: Interval
    votes_for_margin: int

    @property
    def verdict(self) -> str:
        if self.votes == 0 or self.interval.undecided:
            return "too few votes to tell"
        return "better than the baseline" if self.rate > 0.5 else "worse than the baseline"


@dataclass(frozen=True)
class Score:
    version: str
    score: float
    interval: Interval


@dataclass(frozen=True)
class Agreement:
    voter: str
    compared: int
    agreed: int

    @property
    def share(self) -> float | None:
        return self.agreed / self.compared if self.compared else None


@dataclass(frozen=True)
class CheckFlag:
    voter: str
    checks: int
    sided: int
    flagged: bool


@dataclass(frozen=True)
class Figures:
    votes: int
    checks: int
    win_rates: list[WinRate]
    scores: list[Score]
    both_bad_share: float | None
    left_share: float | None
    left_interval: Interval | None
    decisive: int
    agreement: list[Agreement]
    check_flags: list[CheckFlag]


def wilson(successes: float, n: int, z: float = Z95) -> Interval:
    """The Wilson score interval of `successes` out of `n` (fractional successes allowed: ties
    count half). n = 0: the whole of [0, 1]."""
    if n <= 0:
        return Interval(0.0, 1.0)
    p = successes / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    return Interval(max(0.0, centre - half), min(1.0, centre + half))


def votes_for_margin(rate: float, margin: float = MARGIN, z: float = Z95) -> int:
    """The votes a 95% interval of half-width `margin` needs at win rate `rate`: the fewest
    votes whose Wilson interval (the one shown) at that rate is no wider than ±margin. Not the
    normal approximation z² p(1-p) / margin², which says 1 vote at a rate of 0 or 1 (a
    bench read "±0.1 needs 1 votes" beside a 40-vote interval [0.912, 1.000])."""
    def half_width(n: int) -> float:
        interval = wilson(rate * n, n, z)
        return (interval.high - interval.low) / 2

    low, high = 1, 1
    while half_width(high) > margin:  # the half-width falls as the votes grow
        low, high = high + 1, high * 2
    while low < high:
        mid = (low + high) // 2
        low, high = (mid + 1, high) if half_width(mid) > margin else (low, mid)
    return low


def points(vote: PairVote, version: str) -> float:
    """What `vote` gives `version` (one side of it): 1 for a win, ½ for a tie or both bad."""
    if vote.choice in (TIE, BOTH_BAD):
        return 0.5
    won = vote.left if vote.choice == LEFT else vote.right
    return 1.0 if won == version else 0.0


def counted(votes: Sequence[PairVote]) -> list[PairVote]:
    """The votes that judge versions: not on planted checks, between two different versions."""
    return [v for v in votes if not v.check and v.left != v.right]


def win_rate(votes: Sequence[PairVote], *, version: str, baseline: str) -> WinRate:
    between = [v for v in counted(votes) if {v.left, v.right} == {version, baseline}]
    wins = sum(points(v, version) for v in between)
    rate = wins / len(between) if between else 0.5
    return WinRate(version=version, baseline=baseline, votes=len(between), wins=wins, rate=rate,
                   interval=wilson(wins, len(between)), votes_for_margin=votes_for_margin(rate))


def _wins_table(votes: Sequence[PairVote]) -> dict[tuple[str, str], float]:
    table: dict[tuple[str, str], float] = defaultdict(float)
    for v in votes:
        table[(v.left, v.right)] += points(v, v.left)
        table[(v.right, v.left)] += points(v, v.right)
    return table


def _fit(table: dict[tuple[str, str], float], versions: Sequence[str], *, baseline: str) -> dict[str, float]:
    """Hunter's MM iteration on a wins table (the prior added here, on every compared pair)."""
    table = {pair: won + BT_PRIOR for pair, won in table.items()}
    strength = {v: 1.0 for v in versions}
    for _ in range(BT_ITERATIONS):
        updated: dict[str, float] = {}
        for i in versions:
            won = sum(table.get((i, j), 0.0) for j in versions if j != i)
            games = sum((table.get((i, j), 0.0) + table.get((j, i), 0.0)) / (strength[i] + strength[j])
                        for j in versions if j != i)
            updated[i] = won / games if games > 0 else strength[i]
        norm = math.exp(sum(math.log(s) for s in updated.values()) / len(updated))
        updated = {v: s / norm for v, s in updated.items()}
        moved = max(abs(math.log(updated[v] / strength[v])) for v in versions)
        strength = updated
        if moved < 1e-10:
            break
    return {v: math.log(strength[v] / strength[baseline]) for v in versions}


def bradley_terry(votes: Sequence[PairVote], versions: Sequence[str], *, baseline: str) -> dict[str, float]:
    """Each version's log-strength over the baseline's (0 for the baseline), by Hunter's MM
    iteration on the wins table with BT_PRIOR pseudo-wins each way on every compared pair."""
    return _fit(_wins_table(votes), versions, baseline=baseline)


def scores(votes: Sequence[PairVote], versions: Sequence[str], *, baseline: str, seed: int,
           rounds: int = BOOTSTRAP_ROUNDS) -> list[Score]:
    """Bradley–Terry scores with a 95% percentile bootstrap (votes resampled with replacement,
    by a Random seeded `seed`)."""
    judged = counted(votes)
    point = bradley_terry(judged, versions, baseline=baseline)
    # Each vote as the two entries it adds to the wins table, so a resample only adds numbers.
    entries = [((v.left, v.right), points(v, v.left), (v.right, v.left), points(v, v.right)) for v in judged]
    rng = random.Random(seed)
    draws: dict[str, list[float]] = {v: [] for v in versions}
    for _ in range(rounds if judged else 0):
        table: dict[tuple[str, str], float] = defaultdict(float)
        for forward, won, backward, lost in rng.choices(entries, k=len(entries)):
            table[forward] += won
            table[backward] += lost
        for v, s in _fit(table, versions, baseline=baseline).items():
            draws[v].append(s)
    out = []
    for v in versions:
        ranked = sorted(draws[v])
        interval = (Interval(ranked[int(0.025 * (len(ranked) - 1))], ranked[math.ceil(0.975 * (len(ranked) - 1))])
                    if ranked else Interval(point[v], point[v]))
        out.append(Score(version=v, score=point[v], interval=interval))
    return out


def agreement(votes: Sequence[PairVote]) -> list[Agreement]:
    """Each voter's agreement with the leave-one-out majority of the item's other votes."""
    by_item: dict[int, list[PairVote]] = defaultdict(list)
    for v in counted(votes):
        by_item[v.item].append(v)
    compared: Counter[str] = Counter()
    agreed: Counter[str] = Counter()
    for item_votes in by_item.values():
        for vote in item_votes:
            others = Counter(o.choice for o in item_votes if o is not vote).most_common(2)
            if not others or (len(others) == 2 and others[0][1] == others[1][1]):
                continue
            compared[vote.voter] += 1
            agreed[vote.voter] += vote.choice == others[0][0]
    voters = sorted({v.voter for v in votes})
    return [Agreement(voter=p, compared=compared[p], agreed=agreed[p]) for p in voters]


def check_flags(votes: Sequence[PairVote]) -> list[CheckFlag]:
    """Per voter, the planted checks they voted on and how many of those picked a side."""
    checks: Counter[str] = Counter()
    sided: Counter[str] = Counter()
    for v in votes:
        if v.check:
            checks[v.voter] += 1
            sided[v.voter] += v.choice in (LEFT, RIGHT)
    return [CheckFlag(voter=p, checks=checks[p], sided=sided[p],
                      flagged=checks[p] >= CHECKS_MIN and sided[p] >= CHECK_SIDE_SHARE * checks[p])
            for p in sorted(checks)]


def figures(votes: Sequence[PairVote], versions: Sequence[str], *, seed: int) -> Figures:
    """Every figure of an evaluation; `versions[0]` is the baseline (none: no figures)."""
    if not versions:
        return Figures(votes=0, checks=0, win_rates=[], scores=[], both_bad_share=None, left_share=None,
                       left_interval=None, decisive=0, agreement=[], check_flags=[])
    baseline = versions[0]
    judged = counted(votes)
    decisive = [v for v in judged if v.choice in (LEFT, RIGHT)]
    lefts = sum(v.choice == LEFT for v in decisive)
    return Figures(
        votes=len(judged),
        checks=sum(v.check for v in votes),
        win_rates=[win_rate(votes, version=v, baseline=baseline) for v in versions[1:]],
        scores=scores(votes, versions, baseline=baseline, seed=seed) if len(versions) > 2 else [],
        both_bad_share=sum(v.choice == BOTH_BAD for v in judged) / len(judged) if judged else None,
        left_share=lefts / len(decisive) if decisive else None,
        left_interval=wilson(lefts, len(decisive)) if decisive else None,
        decisive=len(decisive),
        agreement=agreement(votes),
        check_flags=check_flags(votes),
    )
