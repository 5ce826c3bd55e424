"""Rater reliability: agreement figures equal the published values, a rater who answers at
random gets a low weight, and the human fold follows the weights."""

from __future__ import annotations

import math
import random

import pytest
from django.contrib.auth.models import User

from apps.buffer.models import Experience
from apps.buffer.services import experience_write
from apps.feedback.raters.reliability import rater_figures, rater_weights, run_agreement
from apps.feedback.kinds.pairwise import feedback_compare
from apps.feedback.kinds.ranking import feedback_rank
from apps.feedback.kinds.rating import feedback_rate
from apps.rewards.models import GoldItem
from apps.runs.models import Run
from tests.factories import add_member, experience_row, make_run, make_user

pytestmark = pytest.mark.django_db

NAN = math.nan
# Krippendorff (2011), "Computing Krippendorff's Alpha-Reliability", the 4 observers x 12 units
# example with missing values; published: ordinal 0.815, interval 0.849 (nominal 0.743).
KRIPPENDORFF_2011 = [
    [1, 2, 3, 3, 2, 1, 4, 1, 2, NAN, NAN, NAN],
    [1, 2, 3, 3, 2, 2, 4, 1, 2, 5, NAN, 3],
    [NAN, 3, 3, 3, 2, 3, 4, 2, 2, 5, 1, NAN],
    [1, 2, 3, 3, 2, 4, 4, 1, 2, 5, 1, NAN],
]


def _items(run: Run, n: int, *, per_group: int = 1) -> list[Experience]:
    rows = [experience_row(run, key=f"i{i}", group=f"g{i // per_group}", status="pending", reward=None,
                           auto_reward=0.5, response_text=f"answer {i}") for i in range(n)]
    return list(Experience.objects.filter(pk__in=experience_write(experiences=rows).ids).order_by("id"))


def test_alpha_of_a_crafted_rating_matrix_equals_the_published_values(owner: User) -> None:
    run = make_run(owner=owner, feedback={"mode": "blend", "overlap": 4})
    items = _items(run, 12)
    raters = [make_user(f"coder{i}") for i in range(4)]
    for rater, row in zip(raters, KRIPPENDORFF_2011, strict=True):
        add_member(run, rater)
        for item, score in zip(items, row, strict=True):
            if not math.isnan(score):
                feedback_rate(run=run, author=rater, experience=item, score=int(score))
    agreement = run_agreement(run=run)
    assert agreement["rating_alpha_ordinal"] == pytest.approx(0.815, abs=5e-4)
    assert agreement["rating_alpha_interval"] == pytest.approx(0.849, abs=5e-4)
    assert agreement["raters"] == 4 and agreement["rated_items"] == 12


def test_pairwise_agreement_is_the_share_of_rater_pairs_that_agree(owner: User) -> None:
    run = make_run(owner=owner, feedback={"mode": "blend", "overlap": 3})
    a, b, c, d = _items(run, 4, per_group=2)
    u1, u2, u3 = (make_user(f"r{i}") for i in range(3))
    for u in (u1, u2, u3):
        add_member(run, u)
    feedback_compare(run=run, author=u1, experience=a, other=b, winner="a")
    feedback_compare(run=run, author=u2, experience=a, other=b, winner="a")
    feedback_compare(run=run, author=u3, experience=a, other=b, winner="b")
    feedback_compare(run=run, author=u1, experience=c, other=d, winner="b")
    feedback_rank(run=run, author=u2, group_id=c.group_id, order=[d.pk, c.pk])
    agreement = run_agreement(run=run)
    # pair (a, b): 3 rater pairs, 1 agrees; pair (c, d): 1 rater pair, agrees -> 2 of 4.
    assert agreement["pairwise_agreement"] == pytest.approx(0.5) and agreement["pairwise_rater_pairs"] == 4


def _three_careful_raters_and_a_careless_one(run: Run, *, seed: int) -> tuple[list[User], User]:
    """30 items, each rated 1 or 5 (at random, by `seed`) by three careful raters who agree,
    and at random from 1 to 5 by a careless one."""
    rng, noise = random.Random(seed), random.Random(0)
    careful = [make_user(f"careful{i}") for i in range(3)]
    careless = make_user("careless")
    for item in _items(run, 30):
        truth = rng.choice([1, 5])
        for u in careful:
            feedback_rate(run=run, author=u, experience=item, score=truth)
        feedback_rate(run=run, author=careless, experience=item, score=noise.randint(1, 5))
    return careful, careless


def test_a_rater_who_answers_at_random_gets_a_low_weight(owner: User) -> None:
    run = make_run(owner=owner, feedback={"mode": "blend", "overlap": 4, "rater_weighting": "agreement"})
    careful, careless = _three_careful_raters_and_a_careless_one(run, seed=1)
    figures = {f.username: f for f in rater_figures(run=run)}
    assert figures["careless"].weight < 0.35
    assert all(figures[u.username].weight > 0.8 for u in careful)
    assert figures["careless"].labels == 30
    weights = rater_weights(run=run)
    assert weights is not None and weights[careless.pk] == figures["careless"].weight


def test_gold_accuracy_weights_raters_and_a_scale_offset_is_measured(owner: User) -> None:
    run = make_run(owner=owner, feedback={"mode": "blend", "overlap": 3, "rater_weighting": "gold"})
    items = _items(run, 16)
    gold, plain = items[:8], items[8:]
    good, bad, harsh = make_user("good"), make_user("bad"), make_user("harsh")
    rng = random.Random(3)
    for i, e in enumerate(gold):
        answer = 5 if i % 2 else 1
        GoldItem.objects.create(run=run, experience=e, answer=(answer - 1) / 4)
        feedback_rate(run=run, author=good, experience=e, score=answer)
        feedback_rate(run=run, author=bad, experience=e, score=6 - answer)  # always wrong
    for e in plain:
        s = rng.randint(2, 5)
        feedback_rate(run=run, author=good, experience=e, score=s)
        feedback_rate(run=run, author=harsh, experience=e, score=s - 1)  # one step below the others
    figures = {f.username: f for f in rater_figures(run=run)}
    assert figures["good"].gold_accuracy == pytest.approx(1.0) and figures["good"].gold_items == 8
    assert figures["bad"].gold_accuracy == pytest.approx(-1.0) and figures["bad"].weight < 0.15
    assert figures["good"].weight == pytest.approx(1.0)
    assert figures["harsh"].scale_offset == pytest.approx(-0.25)
    assert figures["harsh"].gold_items == 0 and figures["harsh"].weight == 1.0  # no gold answers: no evidence


def test_the_human_fold_weights_each_rater_by_reliability(owner: User) -> None:
    """One careless rater cannot steer an item the careful ones agree on."""
    run = make_run(owner=owner, feedback={"mode": "blend", "w_auto": 0.0, "w_human": 1.0, "overlap": 4,
                                          "rater_weighting": "agreement"})
    careful, careless = _three_careful_raters_and_a_careless_one(run, seed=2)
    # A new item: the careful raters say 5, the careless one says 1.
    target = _new_item(run)
    from django.core.cache import cache

    cache.clear()  # the weights are cached for a few seconds; read them fresh
    for u in careful:
        feedback_rate(run=run, author=u, experience=target, score=5)
    feedback_rate(run=run, author=careless, experience=target, score=1)
    target.refresh_from_db()
    assert target.human_reward is not None and target.human_reward > 0.9  # an equal-weight mean would be 0.75

    equal = make_run(owner=owner, feedback={"mode": "blend", "w_auto": 0.0, "w_human": 1.0, "overlap": 4})
    other = _new_item(equal)
    for u in careful:
        feedback_rate(run=equal, author=u, experience=other, score=5)
    feedback_rate(run=equal, author=careless, experience=other, score=1)
    other.refresh_from_db()
    assert other.human_reward == pytest.approx(0.75)


def _new_item(run: Run) -> Experience:
    row = experience_row(run, key="new", group="new-group", status="pending", reward=None, auto_reward=0.5)
    return Experience.objects.get(pk=experience_write(experiences=[row]).ids[0])


def test_a_harsh_raters_scale_is_normalised_before_folding(owner: User) -> None:
    from django.core.cache import cache

    def run_with(normalise: bool) -> float:
        run = make_run(owner=owner, feedback={"mode": "blend", "w_auto": 0.0, "w_human": 1.0, "overlap": 2,
                                              "normalise_raters": normalise})
        good, harsh = make_user(f"good{normalise}"), make_user(f"harsh{normalise}")
        for e, s in zip(_items(run, 6), [2, 3, 4, 5, 3, 4], strict=True):
            feedback_rate(run=run, author=good, experience=e, score=s)
            feedback_rate(run=run, author=harsh, experience=e, score=s - 1)
        cache.clear()
        target = _new_item(run)
        feedback_rate(run=run, author=harsh, experience=target, score=3)  # harsh 3 = everyone else's 4
        target.refresh_from_db()
        assert target.human_reward is not None
        return target.human_reward

    assert run_with(False) == pytest.approx(0.5)
    assert run_with(True) == pytest.approx(0.75)
