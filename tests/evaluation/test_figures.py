"""The figures of a blind evaluation (kernel/pairwise_stats.py), each recomputed here from the
vote rows by a separate route: counts by SQL, the Wilson bound by its defining equation, the
Bradley–Terry scores by the likelihood's stationarity, agreement by brute force."""

from __future__ import annotations

import math
import random
from statistics import NormalDist

import pytest
from django.contrib.auth.models import User

from apps.evaluation.models import Evaluation, Item, Vote
from apps.evaluation.selectors import evaluation_figures, pair_votes
from kernel.pairwise_stats import BT_PRIOR, PairVote, bradley_terry, figures, votes_for_margin, wilson
from tests.evaluation.conftest import MakeEvaluation
from tests.factories import add_member, make_user

pytestmark = pytest.mark.django_db

Z = NormalDist().inv_cdf(0.975)


def _voters(evaluation: Evaluation, n: int) -> list[User]:
    people = [make_user(f"voter{i}") for i in range(n)]
    for p in people:
        add_member(evaluation.run, p)
    return people


def _vote_all(evaluation: Evaluation, people: list[User], pick: random.Random, newer_wins: float) -> None:
    """Each person votes every pair; the newer version wins with probability `newer_wins`."""
    for item in evaluation.items.select_related("left", "right"):
        for person in people:
            if item.is_check:
                choice = pick.choice(["left", "tie", "tie", "both_bad"])
            else:
                r = pick.random()
                newer = "left" if item.left.number > item.right.number else "right"
                older = "right" if newer == "left" else "left"
                choice = newer if r < newer_wins else ("tie" if r < newer_wins + 0.1 else
                                                       "both_bad" if r < newer_wins + 0.15 else older)
            Vote.objects.create(item=item, voter=person, choice=choice)


def _wilson_check(successes: float, n: int, low: float, high: float) -> None:
    # The Wilson bounds are the two p where |p̂ - p| = z sqrt(p(1-p)/n).
    p_hat = successes / n
    for p in (low, high):
        if 0 < p < 1:
            assert abs(abs(p_hat - p) - Z * math.sqrt(p * (1 - p) / n)) < 1e-9


def test_two_versions_win_rate_interval_both_bad_and_position_bias_from_rows(make_evaluation: MakeEvaluation) -> None:
    evaluation = make_evaluation(prompts=20, votes_per_pair=3)
    people = _voters(evaluation, 3)
    _vote_all(evaluation, people, random.Random(1), newer_wins=0.6)
    fig = evaluation_figures(evaluation)

    judged = Vote.objects.filter(item__evaluation=evaluation, item__is_check=False)
    n = judged.count()
    newer_side_wins = sum(1 for v in judged.select_related("item__left", "item__right")
                          if v.choice in ("left", "right")
                          and getattr(v.item, v.choice).number == 2)
    halves = judged.filter(choice__in=["tie", "both_bad"]).count()
    [rate] = fig.win_rates
    assert (rate.version, rate.baseline, rate.votes) == ("v2", "v0", n) and n == 20 * 3
    assert rate.rate == pytest.approx((newer_side_wins + halves / 2) / n)
    _wilson_check(newer_side_wins + halves / 2, n, rate.interval.low, rate.interval.high)
    assert rate.verdict == ("too few votes to tell" if rate.interval.low <= 0.5 <= rate.interval.high
                            else "better than the baseline" if rate.rate > 0.5 else "worse than the baseline")
    assert rate.votes_for_margin == _votes_for_tenth(rate.rate)
    assert fig.both_bad_share == pytest.approx(judged.filter(choice="both_bad").count() / n)
    decisive = judged.filter(choice__in=["left", "right"])
    assert fig.decisive == decisive.count()
    assert fig.left_share == pytest.approx(decisive.filter(choice="left").count() / decisive.count())
    assert fig.checks == Vote.objects.filter(item__evaluation=evaluation, item__is_check=True).count() > 0
    assert fig.scores == []  # two versions: the win rate says it all


def test_three_versions_bradley_terry_scores_are_the_likelihoods_stationary_point(make_evaluation: MakeEvaluation) -> None:
    evaluation = make_evaluation(versions=[0, 1, 2], prompts=12, votes_per_pair=2)
    _vote_all(evaluation, _voters(evaluation, 2), random.Random(2), newer_wins=0.7)
    fig = evaluation_figures(evaluation)
    assert [s.version for s in fig.scores] == ["v0", "v1", "v2"] and fig.scores[0].score == 0.0
    strength = {s.version: math.exp(s.score) for s in fig.scores}
    # Wins from the rows (ties and both-bad half each way), the prior on every compared pair.
    wins: dict[tuple[str, str], float] = {}
    for v in Vote.objects.filter(item__evaluation=evaluation, item__is_check=False).select_related("item__left", "item__right"):
        a, b = f"v{v.item.left.number}", f"v{v.item.right.number}"
        wa = {"left": 1.0, "right": 0.0}.get(v.choice, 0.5)
        wins[(a, b)] = wins.get((a, b), BT_PRIOR) + wa
        wins[(b, a)] = wins.get((b, a), BT_PRIOR) + 1 - wa
    for i in strength:
        won = sum(w for (a, _), w in wins.items() if a == i)
        expected = sum((wins[(i, j)] + wins[(j, i)]) * strength[i] / (strength[i] + strength[j])
                       for j in strength if j != i and (i, j) in wins)
        assert won == pytest.approx(expected, rel=1e-6)
    for s in fig.scores[1:]:
        assert s.interval.low <= s.score <= s.interval.high
    # The bootstrap is seeded by the evaluation's recorded seed: the same votes, the same intervals.
    assert evaluation_figures(evaluation).scores == fig.scores


def test_agreement_with_the_majority_and_check_flags_by_brute_force(make_evaluation: MakeEvaluation) -> None:
    evaluation = make_evaluation(prompts=20, votes_per_pair=3)
    people = _voters(evaluation, 3)
    _vote_all(evaluation, people, random.Random(3), newer_wins=0.5)
    checks = list(evaluation.items.filter(is_check=True))
    assert len(checks) == 2
    # voter0 picks a side on every check: flagged; the others say tie.
    Vote.objects.filter(item__in=checks).update(choice="tie")
    Vote.objects.filter(item__in=checks, voter=people[0]).update(choice="right")
    fig = evaluation_figures(evaluation)
    flags = {f.voter: f for f in fig.check_flags}
    assert flags["voter0"].flagged and flags["voter0"].sided == 2 == flags["voter0"].checks
    assert not flags["voter1"].flagged and flags["voter1"].sided == 0

    for person in people:
        compared = agreed = 0
        for item in Item.objects.filter(evaluation=evaluation, is_check=False):
            mine = item.votes.filter(voter=person).values_list("choice", flat=True).first()
            others = list(item.votes.exclude(voter=person).values_list("choice", flat=True))
            counts = sorted(((others.count(c), c) for c in set(others)), reverse=True)
            if mine is None or not counts or (len(counts) > 1 and counts[0][0] == counts[1][0]):
                continue
            compared += 1
            agreed += mine == counts[0][1]
        [row] = [a for a in fig.agreement if a.voter == person.username]
        assert (row.compared, row.agreed) == (compared, agreed)


def _votes_for_tenth(rate: float) -> int:
    """The fewest votes whose Wilson interval at `rate` spans ±0.1 at most, by counting up."""
    n = 1
    while (wilson(rate * n, n).high - wilson(rate * n, n).low) / 2 > 0.1:
        n += 1
    return n


def test_pure_figures_edge_cases() -> None:
    assert wilson(0, 0).low == 0.0 and wilson(0, 0).high == 1.0
    assert figures([], [], seed=0).win_rates == []
    assert votes_for_margin(0.5) == _votes_for_tenth(0.5) == 93  # the normal approximation said 97
    # At a win rate of 1 the normal approximation said 1 vote; Wilson's interval needs 16.
    assert votes_for_margin(1.0) == _votes_for_tenth(1.0) == 16 and votes_for_margin(0.0) == 16
    votes = [PairVote(item=i, left="v0", right="v1", choice="right", voter=f"p{i}") for i in range(30)]
    fig = figures(votes, ["v0", "v1"], seed=0)
    assert fig.win_rates[0].rate == 1.0 and fig.win_rates[0].verdict == "better than the baseline"
    assert fig.left_share == 0.0
    few = figures(votes[:2], ["v0", "v1"], seed=0)
    assert few.win_rates[0].verdict == "too few votes to tell"
    # Never lost: the prior keeps the score finite.
    assert math.isfinite(bradley_terry(votes, ["v0", "v1"], baseline="v0")["v1"])


def test_pair_votes_read_the_rows(make_evaluation: MakeEvaluation, annotator: User) -> None:
    evaluation = make_evaluation(prompts=2)
    item = evaluation.items.filter(is_check=False).select_related("left", "right").first()
    assert item is not None
    Vote.objects.create(item=item, voter=annotator, choice="left")
    [vote] = pair_votes(evaluation)
    assert (vote.left, vote.right, vote.voter, vote.check) == (f"v{item.left.number}", f"v{item.right.number}",
                                                               "annotator", False)
