"""The learned fold without a model in the loop (crafted reward-model versions and scores):
an untrusted rater's rating does not replace the reward model, and the beat puts due work
on the reward queue."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User

from apps.buffer.models import Experience
from apps.buffer.services import experience_write
from apps.feedback.kinds.rating import feedback_rate
from apps.feedback.reward_model.versions import reward_model_usable, rm_scores_apply
from apps.rewards.models import GoldItem, RewardModel
from apps.runs.models import Run
from tests.factories import add_member, experience_row, make_run, make_user

pytestmark = pytest.mark.django_db


def _items(run: Run, n: int, group: str) -> list[Experience]:
    rows = [experience_row(run, key=f"{group}-{i}", group=group, status="pending", reward=None, auto_reward=0.0,
                           response_text=f"answer {group} {i}") for i in range(n)]
    return list(Experience.objects.filter(pk__in=experience_write(experiences=rows).ids).order_by("id"))


def test_a_member_only_an_untrusted_rater_rated_takes_the_reward_models_reward(owner: User) -> None:
    from django.core.cache import cache

    run = make_run(owner=owner, feedback={"mode": "learned", "w_auto": 0.0, "w_rm": 1.0, "w_human": 1.0,
                                          "rater_weighting": "gold", "min_rm_accuracy": 0.7},
                   reward_model={"enabled": True})
    careful, careless = make_user("careful"), make_user("careless")
    for u in (careful, careless):
        add_member(run, u)
    gold = _items(run, 8, "gold")
    for i, e in enumerate(gold):
        right = 5 if i % 2 else 1
        GoldItem.objects.create(run=run, experience=e, answer=(right - 1) / 4)
        feedback_rate(run=run, author=careful, experience=e, score=right)
        feedback_rate(run=run, author=careless, experience=e, score=6 - right)
    cache.clear()
    a, b, c = _items(run, 3, "new")
    feedback_rate(run=run, author=careless, experience=a, score=5)  # the careless rater says a is great
    feedback_rate(run=run, author=careful, experience=b, score=4)
    rm = RewardModel.objects.create(run=run, version=1, path="/x", base="b", accuracy=0.9, scale=0.25, offset=0.5,
                                    pairs_heldout=40)
    assert reward_model_usable(run=run) == rm
    rm_scores_apply(run=run, rm=rm, scores={a.pk: -2.0, b.pk: 0.0, c.pk: 1.0})
    a, b, c = (Experience.objects.get(pk=e.pk) for e in (a, b, c))
    assert {a.status, b.status, c.status} == {"ready"}
    assert a.reward == pytest.approx(rm.calibrated(-2.0)) == pytest.approx(0.0)  # not the careless 5 (1.0)
    assert b.reward == pytest.approx(0.75)  # the trusted person's 4
    assert c.reward == pytest.approx(0.75)  # no one rated it: the reward model


def test_learned_waits_like_blend_while_the_reward_model_is_not_good_enough(owner: User) -> None:
    run = make_run(owner=owner, feedback={"mode": "learned", "min_rm_accuracy": 0.8, "rm_gate": "bound"},
                   reward_model={"enabled": True})
    a, b = _items(run, 2, "g")
    rm = RewardModel.objects.create(run=run, version=1, path="/x", base="b", accuracy=0.75, pairs_heldout=100)
    assert reward_model_usable(run=run) is None
    assert rm_scores_apply(run=run, rm=rm, scores={a.pk: 1.0, b.pk: 0.0}) == 0
    assert set(Experience.objects.filter(pk__in=[a.pk, b.pk]).values_list("status", flat=True)) == {"pending"}
    # A high accuracy on a handful of held-out pairs is no evidence either: 5 of 5 right is
    # at least 0.65 with 95% confidence, short of 0.8; 20 of 20 is at least 0.88.
    lucky = RewardModel.objects.create(run=run, version=2, path="/x", base="b", accuracy=1.0, pairs_heldout=5)
    assert reward_model_usable(run=run) is None
    assert rm_scores_apply(run=run, rm=lucky, scores={a.pk: 1.0, b.pk: 0.0}) == 0
    RewardModel.objects.filter(pk=lucky.pk).update(pairs_heldout=20)
    assert reward_model_usable(run=run) == lucky


@pytest.mark.parametrize("accuracy,pairs,usable", [
    (1.0, 9, True),     # the old rule (>= 20 pairs) waited for 11 more
    (1.0, 8, False),    # 8 of 8: at least 0.747 with 95% confidence
    (0.9, 40, True),    # at least 0.795
    (0.9, 20, False),   # at least 0.72: a mediocre model needs more evidence than a perfect one
    (0.69, 103, False),  # the noisy arm's model of round 7: never, however many pairs
])
def test_the_reward_model_gate_is_a_lower_confidence_bound_on_held_out_accuracy(
    owner: User, accuracy: float, pairs: int, usable: bool,
) -> None:
    run = make_run(owner=owner, feedback={"mode": "learned", "min_rm_accuracy": 0.75, "rm_gate": "bound"},
                   reward_model={"enabled": True})
    rm = RewardModel.objects.create(run=run, version=1, path="/x", base="b", accuracy=accuracy, pairs_heldout=pairs)
    assert (reward_model_usable(run=run) == rm) is usable


def _gated_run(owner: User, gate: str, *, accuracy: float, pairs: int,
               scale: float) -> tuple[Run, RewardModel, Experience, Experience]:
    """A `learned` run under `gate` (full weight at 0.75, the reward model alone where no one
    rated), two unrated members of a group and a version measured at `accuracy` on `pairs`."""
    run = make_run(owner=owner, feedback={"mode": "learned", "min_rm_accuracy": 0.75, "rm_gate": gate,
                                          "w_auto": 0.0, "w_rm": 1.0},
                   reward_model={"enabled": True})
    a, b = _items(run, 2, "g")
    rm = RewardModel.objects.create(run=run, version=1, path="/x", base="b", accuracy=accuracy, pairs_heldout=pairs,
                                    scale=scale, offset=0.5)
    return run, rm, a, b


@pytest.mark.parametrize("accuracy,pairs,weight", [
    (1.0, 9, 1.0),      # the bound gate's model: bound 0.75 reached, full weight as before
    (1.0, 4, 0.39),     # 4 of 4: bound 0.60, above chance; the bound gate would keep it out
    (0.9, 20, 0.95),    # bound 0.74
    (0.55, 40, None),   # bound 0.42: no better than chance with 95% confidence, not used at all
])
def test_the_evidence_gate_lets_a_better_than_chance_model_in_at_the_weight_its_bound_earned(
    owner: User, accuracy: float, pairs: int, weight: float | None,
) -> None:
    """`rm_gate: evidence`: a version is folded in once its held-out accuracy's lower bound is
    above chance, its calibrated scores drawn toward the scale's middle by (bound - 0.5) /
    (min_rm_accuracy - 0.5); the rewards a group trains on carry that share of its differences."""
    from apps.feedback.reward_model.versions import accuracy_lower_bound, reward_model_weight

    run, rm, a, b = _gated_run(owner, "evidence", accuracy=accuracy, pairs=pairs, scale=0.25)
    if weight is None:
        assert reward_model_usable(run=run) is None
        assert rm_scores_apply(run=run, rm=rm, scores={a.pk: 2.0, b.pk: -2.0}) == 0
        return
    assert reward_model_usable(run=run) == rm
    bound = accuracy_lower_bound(accuracy=accuracy, pairs=pairs, confidence=0.95)
    assert reward_model_weight(run=run, rm=rm) == pytest.approx(min(1.0, (bound - 0.5) / 0.25)) \
        == pytest.approx(weight, abs=0.01)
    assert rm_scores_apply(run=run, rm=rm, scores={a.pk: 2.0, b.pk: -2.0}) == 1
    a, b = (Experience.objects.get(pk=e.pk) for e in (a, b))
    # Calibrated 1.0 and 0.0; drawn toward 0.5 by the weight: a difference of `weight`.
    assert a.reward == pytest.approx(0.5 + weight * 0.5, abs=0.01) and b.reward == pytest.approx(0.5 - weight * 0.5,
                                                                                                  abs=0.01)
    assert a.status == b.status == "ready"


@pytest.mark.parametrize("accuracy,pairs,usable", [
    (1.0, 4, True),     # bound 0.60: in, at full weight (evidence would give it 0.39)
    (0.7, 60, True),    # bound 0.59
    (0.55, 40, False),  # bound 0.42: no better than chance with 95% confidence, not used at all
])
def test_the_calibrated_gate_lets_a_better_than_chance_model_in_at_its_calibrations_scale(
    owner: User, accuracy: float, pairs: int, usable: bool,
) -> None:
    """`rm_gate: calibrated`: in once the bound is above chance, with no discount beside the
    calibration's own: the rewards carry the calibrated scores as they are."""
    from apps.feedback.reward_model.versions import reward_model_weight

    run, rm, a, b = _gated_run(owner, "calibrated", accuracy=accuracy, pairs=pairs, scale=0.1)
    if not usable:
        assert reward_model_usable(run=run) is None
        assert rm_scores_apply(run=run, rm=rm, scores={a.pk: 2.0, b.pk: -2.0}) == 0
        return
    assert reward_model_usable(run=run) == rm
    assert reward_model_weight(run=run, rm=rm) == 1.0
    assert rm_scores_apply(run=run, rm=rm, scores={a.pk: 2.0, b.pk: -2.0}) == 1
    a, b = (Experience.objects.get(pk=e.pk) for e in (a, b))
    assert (a.reward, b.reward) == (pytest.approx(0.7), pytest.approx(0.3))  # 0.1 * (+-2) + 0.5


def test_the_calibrated_gate_is_the_default_and_the_bound_gate_keeps_the_reward_model_out_until_reached(
    owner: User,
) -> None:
    """4 of 4 held-out pairs: a bound of 0.60, above chance, short of 0.75. A run that names
    no gate uses the model (`calibrated`); one that asks for `bound` waits."""
    default = make_run(owner=owner, feedback={"mode": "learned", "min_rm_accuracy": 0.75}, reward_model={"enabled": True})
    assert default.cfg.feedback.rm_gate == "calibrated"
    # Stored with the run: a later change of the default does not move a run's gate.
    assert default.config["feedback"]["rm_gate"] == "calibrated"
    rm = RewardModel.objects.create(run=default, version=1, path="/x", base="b", accuracy=1.0, pairs_heldout=4)
    assert reward_model_usable(run=default) == rm
    bound = make_run(owner=owner, feedback={"mode": "learned", "min_rm_accuracy": 0.75, "rm_gate": "bound"},
                     reward_model={"enabled": True})
    RewardModel.objects.create(run=bound, version=1, path="/x", base="b", accuracy=1.0, pairs_heldout=4)
    assert reward_model_usable(run=bound) is None


def test_the_lower_bound_is_wilsons_and_confidence_one_half_is_the_point_estimate() -> None:
    from scipy.stats import binomtest

    from apps.feedback.reward_model.versions import accuracy_lower_bound

    for hits, n in [(9, 9), (18, 20), (71, 103), (3, 10)]:
        for confidence in (0.9, 0.95):
            # One-sided at c is the lower end of the two-sided interval at 2c - 1.
            expected = binomtest(hits, n).proportion_ci(confidence_level=2 * confidence - 1, method="wilson").low
            assert accuracy_lower_bound(accuracy=hits / n, pairs=n, confidence=confidence) == pytest.approx(expected)
    assert accuracy_lower_bound(accuracy=0.8, pairs=3, confidence=0.5) == 0.8
    assert accuracy_lower_bound(accuracy=1.0, pairs=0, confidence=0.95) == 0.0


def test_the_beat_puts_due_training_and_scoring_on_the_reward_queue(owner: User, annotator: User) -> None:
    import json

    import redis
    from django.conf import settings

    from apps.feedback.tasks import reward_model_beat_task

    run = make_run(owner=owner, feedback={"mode": "blend"}, reward_model={"enabled": True, "retrain_every": 2})
    add_member(run, annotator)
    Run.objects.filter(pk=run.pk).update(status=Run.Status.RUNNING)
    r = redis.Redis.from_url(settings.REDIS_URL)
    r.delete("reward")
    a, b, _unrated = _items(run, 3, "g")
    assert reward_model_beat_task() == {"train": 0, "score": 0}
    feedback_rate(run=run, author=annotator, experience=a, score=5)
    feedback_rate(run=run, author=annotator, experience=b, score=1)
    RewardModel.objects.create(run=run, version=1, path="/x", base="b", accuracy=0.9, labels=0)
    assert reward_model_beat_task() == {"train": 1, "score": 1}
    names = [json.loads(m)["headers"]["task"] for m in r.lrange("reward", 0, -1)]
    assert names.count("workers.reward.trainer.reward_model_train") >= 1
    assert "workers.reward.trainer.reward_model_score" in names
    r.delete("reward")


def test_calibration_on_held_out_ratings_shrinks_an_uninformative_model_to_the_mean() -> None:
    """A model whose scores do not follow people adds no spread to a group's rewards (GRPO
    would otherwise train on its noise); one that does keeps its order on the human scale."""
    from workers.reward.trainer import calibration_fit

    humans = [1.0, 0.0, 0.0, 0.0] * 4
    noise = [0.3, 2.0, -1.0, 0.7, -0.2, 1.1, 0.4, -2.0, 1.5, 0.9, -0.7, 0.1, 0.8, -1.4, 2.2, 0.0]
    slope, offset = calibration_fit(noise[::-1], humans)  # anti-correlated or unrelated: slope 0
    assert slope == 0.0 and offset == pytest.approx(sum(humans) / len(humans))
    scores = [3.0 if h else -3.0 for h in humans]
    slope, offset = calibration_fit([s + n * 0.1 for s, n in zip(scores, noise, strict=True)], humans)
    assert slope > 0 and slope * 3.0 + offset > 0.9 and slope * -3.0 + offset < 0.1


def test_the_owners_rejection_of_a_label_the_newest_version_learnt_from_makes_the_next_one_due_at_once(
        owner: User, annotator: User, django_capture_on_commit_callbacks: Any) -> None:
    import json
    from datetime import timedelta

    import redis
    from django.conf import settings
    from django.utils import timezone

    from apps.feedback.reward_model.versions import reward_model_due
    from apps.feedback.models import Feedback
    from apps.feedback.review.services import feedback_reject

    run = make_run(owner=owner, feedback={"mode": "blend"}, reward_model={"enabled": True, "retrain_every": 20})
    add_member(run, annotator)
    Run.objects.filter(pk=run.pk).update(status=Run.Status.RUNNING)
    r = redis.Redis.from_url(settings.REDIS_URL)
    r.delete("reward")
    a, b = _items(run, 2, "g")
    feedback_rate(run=run, author=annotator, experience=a, score=5)
    wrong = feedback_rate(run=run, author=annotator, experience=b, score=5)
    RewardModel.objects.create(run=run, version=1, path="/x", base="b", accuracy=0.9, labels=2, seconds=3.0)
    assert not reward_model_due(run=run)  # 2 labels of the 20 a version waits for
    # v1 learnt from Annie's second rating; the owner rejects it: a new version is due now,
    # not 20 labels later (the label count went down), and its training is queued at once.
    with django_capture_on_commit_callbacks(execute=True):
        feedback_reject(run=run, feedback_id=wrong.pk, reviewer=owner)
    assert reward_model_due(run=run)
    names = [json.loads(m)["headers"]["task"] for m in r.lrange("reward", 0, -1)]
    assert names == ["workers.reward.trainer.reward_model_train"], names
    # Once a version read the labels after the rejection, nothing more is due.
    Feedback.objects.filter(pk=wrong.pk).update(reviewed_at=timezone.now() - timedelta(minutes=10))
    RewardModel.objects.create(run=run, version=2, path="/y", base="b", accuracy=0.9, labels=1, seconds=3.0)
    assert not reward_model_due(run=run)
    r.delete("reward")
