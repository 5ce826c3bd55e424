"""What the reward model learns from, with rater reliability on: a rater who answers at random
(crafted: gold answers drawn at random) puts no pair into its training or held-out set, by any
kind of feedback; a partly trusted rater's pairs count by their trust."""

from __future__ import annotations

import random

import pytest
from django.contrib.auth.models import User

from apps.buffer.models import Experience
from apps.buffer.services import experience_write
from apps.feedback.reward_model.preferences import preference_pairs
from apps.feedback.raters.reliability import TRUSTED_WEIGHT, rater_figures
from apps.feedback.kinds.pairwise import feedback_compare
from apps.feedback.kinds.ranking import feedback_rank
from apps.feedback.kinds.rating import feedback_rate
from apps.rewards.models import GoldItem
from apps.runs.models import Run
from tests.factories import add_member, experience_row, make_run, make_user
from workers.reward.trainer import pairwise_accuracy, reward_model_pairs
from apps.runs.ports import run_view_of

pytestmark = pytest.mark.django_db


def _group(run: Run, group: str, n: int) -> list[Experience]:
    # Member i is right when i is even: "right ..." / "wrong ..." says which, for the checks.
    rows = [experience_row(run, key=f"{group}-{i}", group=group, status="pending", reward=None, auto_reward=0.5,
                           prompt_text=f"prompt {group}", response_text=f"{'right' if i % 2 == 0 else 'wrong'} {group} {i}")
            for i in range(n)]
    return list(Experience.objects.filter(pk__in=experience_write(experiences=rows).ids).order_by("id"))


def _right(e: Experience) -> bool:
    return e.response_text.startswith("right")


@pytest.fixture
def rated(owner: User) -> tuple[Run, User, User]:
    """A careful rater and one who answers at random, both measured on 8 gold items; then in
    each of 12 groups the careful one rates two members and the random one the other two, and
    the random one also compares and ranks, always for the wrong answer."""
    run = make_run(owner=owner, feedback={"mode": "blend", "rater_weighting": "gold"},
                   reward_model={"enabled": True, "heldout_share": 0.5})
    careful, careless = make_user("careful"), make_user("careless")
    for u in (careful, careless):
        add_member(run, u)
    rng = random.Random(3)
    for e in _group(run, "gold", 8):
        GoldItem.objects.create(run=run, experience=e, answer=1.0 if _right(e) else 0.0)
        feedback_rate(run=run, author=careful, experience=e, score=5 if _right(e) else 1)
        feedback_rate(run=run, author=careless, experience=e, score=rng.randint(1, 5))
    for g in range(12):
        a, b, c, d = _group(run, f"g{g}", 4)  # a, c right; b, d wrong
        feedback_rate(run=run, author=careful, experience=a, score=5)
        feedback_rate(run=run, author=careful, experience=b, score=1)
        feedback_rate(run=run, author=careless, experience=c, score=1)
        feedback_rate(run=run, author=careless, experience=d, score=5)
        feedback_compare(run=run, author=careless, experience=d, other=a, winner="a")
        feedback_rank(run=run, author=careless, order=[d.pk, b.pk, c.pk, a.pk])
    return run, careful, careless


def test_a_random_rater_puts_no_pair_into_the_reward_models_training_or_held_out_set(
    rated: tuple[Run, User, User],
) -> None:
    run, careful, careless = rated
    weights = {f.username: f.weight for f in rater_figures(run=run)}
    assert weights["careless"] < TRUSTED_WEIGHT <= weights["careful"]  # the gold items measured it

    train, heldout = reward_model_pairs(run=run_view_of(run))

    assert train and heldout
    ids = {e.pk: e for e in Experience.objects.filter(run=run)}
    for p in train + heldout:
        # Only the careful rater's verdicts: right over wrong, never the reverse, and never a
        # member only the careless rater rated (their choice and ranking pairs are out too).
        assert _right(ids[p.chosen_id]) and not _right(ids[p.rejected_id]), p
        # Trusted as far as 8 of 8 gold answers earned: 8 / 9.
        assert p.kind == "rating" and p.trust == pytest.approx(8 / 9)
    # Without weighting, the careless rater's pairs (wrong over right) are in: the test sees them.
    unweighted = preference_pairs(run=run)
    assert any(not _right(ids[p.chosen_id]) for p in unweighted)
    assert {p.kind for p in unweighted} == {"rating", "pairwise", "ranking"}


def test_a_partly_trusted_raters_pairs_count_by_their_trust(rated: tuple[Run, User, User]) -> None:
    run, careful, careless = rated
    pairs = preference_pairs(run=run, rater_weights={careful.pk: 1.0, careless.pk: 0.6})
    by_kind = {p.kind: p.trust for p in pairs if p.kind != "rating"}
    assert by_kind == {"pairwise": pytest.approx(0.6), "ranking": pytest.approx(0.6)}
    # A rating pair is as trusted as its less trusted side.
    ratings = {(p.chosen_id, p.rejected_id): p.trust for p in pairs if p.kind == "rating"}
    assert sorted({round(t, 6) for t in ratings.values()}) == [0.6, 1.0]
    # Held-out accuracy weighs each pair by its trust: one wrong 0.6 pair beside one right 1.0.
    assert pairwise_accuracy([1.0, 0.0], [0.0, 1.0], [1.0, 0.6]) == pytest.approx(1.0 / 1.6)


def test_a_random_rater_lucky_on_few_gold_items_and_an_unmeasured_one_teach_the_reward_model_nothing(
    owner: User,
) -> None:
    # bench/steering's noisy arm: the random rater answered 4 gold items with accuracy 0.375, so
    # the fold (which trusts a rater until measured otherwise) weighed it 0.5, trusted, and
    # its random pairs went into the reward model. The reward model trusts only what was earned.
    run = make_run(owner=owner, feedback={"mode": "blend", "rater_weighting": "gold"},
                   reward_model={"enabled": True, "heldout_share": 0.5})
    careful, lucky, unmeasured = make_user("careful"), make_user("lucky"), make_user("unmeasured")
    for u in (careful, lucky, unmeasured):
        add_member(run, u)
    gold = _group(run, "gold", 4)  # right, wrong, right, wrong
    for e, lucky_score in zip(gold, [5, 3, 4, 3], strict=True):  # errors 0, .5, .25, .5: accuracy 0.375
        GoldItem.objects.create(run=run, experience=e, answer=1.0 if _right(e) else 0.0)
        feedback_rate(run=run, author=careful, experience=e, score=5 if _right(e) else 1)
        feedback_rate(run=run, author=lucky, experience=e, score=lucky_score)
    for g in range(8):
        a, b, c, d, x, y = _group(run, f"g{g}", 6)  # a, c, x right; b, d, y wrong
        feedback_rate(run=run, author=careful, experience=a, score=5)
        feedback_rate(run=run, author=careful, experience=b, score=1)
        feedback_rate(run=run, author=lucky, experience=c, score=1)
        feedback_rate(run=run, author=lucky, experience=d, score=5)
        feedback_rate(run=run, author=unmeasured, experience=x, score=1)
        feedback_rate(run=run, author=unmeasured, experience=y, score=5)
    figures = {f.username: f for f in rater_figures(run=run)}
    # The fold trusts both (a human reward is one group's; a new rater counts at once) ...
    assert figures["lucky"].weight == pytest.approx(0.5) and figures["unmeasured"].weight == 1.0
    # ... the reward model neither: 1.5 of 5 earned, and nothing measured.
    assert figures["lucky"].earned == pytest.approx(0.3) and figures["unmeasured"].earned == 0.0
    assert figures["careful"].earned == pytest.approx(0.8)  # 4 of 4 gold right

    train, heldout = reward_model_pairs(run=run_view_of(run))

    ids = {e.pk: e for e in Experience.objects.filter(run=run)}
    assert train and heldout
    assert all(_right(ids[p.chosen_id]) and not _right(ids[p.rejected_id]) for p in train + heldout)
    assert all(p.trust == pytest.approx(0.8) for p in train + heldout)
