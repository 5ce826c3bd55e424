"""The fold and its wait windows: blend arithmetic, wait windows, late feedback, rankings."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from apps.buffer.models import Experience
from apps.buffer.services import batch_ack, batch_claim, experience_write
from apps.feedback.models import Feedback
from kernel.fold import DROP_REASON, borda_scores, rating_normalise, reward_combine
from apps.feedback.selectors import dpo_pairs, feedback_counts
from apps.feedback.kinds.rate_and_flag import feedback_rate_and_flag
from apps.feedback.handout.expiry import feedback_wait_expire
from apps.feedback.kinds.edit import feedback_edit
from apps.feedback.kinds.pairwise import feedback_compare
from apps.feedback.kinds.ranking import feedback_rank
from apps.feedback.kinds.rating import feedback_rate
from kernel.config import FeedbackSettings
from apps.runs.models import Run
from kernel.exceptions import InvalidInput, NotFound
from tests.factories import add_member, experience_row, make_run, make_user

pytestmark = pytest.mark.django_db


def _group(run: Run, *, autos: list[float | None], group: str = "g1", status: str = "pending") -> list[Experience]:
    rows = [
        experience_row(run, key=f"{group}-{i}", group=group, status=status, auto_reward=a, reward=None,
                       response_text=f"answer {i}")
        for i, a in enumerate(autos)
    ]
    ids = experience_write(experiences=rows).ids
    return list(Experience.objects.filter(pk__in=ids).order_by("id"))


def _fresh(exps: list[Experience]) -> list[Experience]:
    return list(Experience.objects.filter(pk__in=[e.pk for e in exps]).order_by("id"))


def test_ratings_and_thumbs_map_onto_the_unit_scale() -> None:
    assert [rating_normalise(score=s) for s in (1, 2, 3, 4, 5)] == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert rating_normalise(thumb="up") == 1.0 and rating_normalise(thumb="down") == 0.0
    for bad in (0, 6, 2.5, True, None):
        with pytest.raises(ValueError):
            rating_normalise(score=bad)  # type: ignore[arg-type]


def test_borda_gives_best_one_and_worst_zero_evenly_spaced() -> None:
    assert borda_scores([7, 3, 9, 1]) == {7: 1.0, 3: 2 / 3, 9: 1 / 3, 1: 0.0}
    assert borda_scores([5]) == {5: 1.0}


def test_blend_weights_auto_and_human_rewards() -> None:
    feedback_cfg = FeedbackSettings(mode="blend", w_auto=0.3, w_human=0.7)
    assert reward_combine(feedback_cfg=feedback_cfg, auto=1.0, human=0.25) == pytest.approx(0.3 * 1.0 + 0.7 * 0.25)
    assert reward_combine(feedback_cfg=feedback_cfg, auto=0.0, human=None) is None
    assert reward_combine(feedback_cfg=feedback_cfg, auto=None, human=0.5) == 0.5
    assert reward_combine(feedback_cfg=FeedbackSettings(mode="human"), auto=1.0, human=0.25) == 0.25
    assert reward_combine(feedback_cfg=FeedbackSettings(mode="auto"), auto=1.0, human=0.25) == 1.0


def test_a_blend_group_becomes_trainable_when_every_member_is_rated(owner: User) -> None:
    run = make_run(owner=owner, feedback={"mode": "blend", "w_auto": 0.4, "w_human": 0.6})
    members = _group(run, autos=[1.0, 0.0, 0.5])
    for member, score in zip(members[:2], (5, 2)):
        feedback_rate(run=run, author=owner, experience=member, score=score)
    partial = _fresh(members)
    assert [m.status for m in partial] == ["pending"] * 3
    assert partial[0].reward == pytest.approx(0.4 * 1.0 + 0.6 * 1.0)
    assert partial[1].reward == pytest.approx(0.4 * 0.0 + 0.6 * 0.25)
    assert batch_claim(run=run, worker="t", size=10, group_complete=True) == []

    feedback_rate(run=run, author=owner, experience=members[2], score=3)
    done = _fresh(members)
    assert [m.status for m in done] == ["ready"] * 3
    assert done[2].human_reward == 0.5 and done[2].reward == pytest.approx(0.4 * 0.5 + 0.6 * 0.5)
    assert len(batch_claim(run=run, worker="t", size=10, group_complete=True)) == 3


def test_human_mode_uses_the_mean_human_reward_and_waits_for_overlap(owner: User, annotator: User) -> None:
    run = make_run(owner=owner, feedback={"mode": "human", "overlap": 2})
    add_member(run, annotator)
    (only,) = _group(run, autos=[1.0])
    feedback_rate(run=run, author=owner, experience=only, score=5)
    assert _fresh([only])[0].status == "pending"  # one annotator of the two the run asks for
    feedback_rate(run=run, author=annotator, experience=only, score=2)
    (after,) = _fresh([only])
    assert after.status == "ready" and after.reward == pytest.approx((1.0 + 0.25) / 2)


def test_a_ranking_gives_each_member_its_normalised_borda_reward(owner: User) -> None:
    run = make_run(owner=owner, feedback={"mode": "human"})
    members = _group(run, autos=[0.0, 0.0, 0.0, 0.0])
    order = [members[2].pk, members[0].pk, members[3].pk, members[1].pk]
    fb = feedback_rank(run=run, author=owner, group_id="g1", order=order)
    assert fb.late is False
    rewards = {m.pk: m.reward for m in _fresh(members)}
    assert [rewards[pk] for pk in order] == pytest.approx([1.0, 2 / 3, 1 / 3, 0.0])
    assert {m.status for m in _fresh(members)} == {"ready"}


def test_a_ranking_must_order_the_whole_group(owner: User) -> None:
    run = make_run(owner=owner, feedback={"mode": "human"})
    members = _group(run, autos=[0.0, 0.0, 0.0])
    with pytest.raises(InvalidInput, match="every completion") as refused:
        feedback_rank(run=run, author=owner, group_id="g1", order=[members[0].pk, members[1].pk])
    assert refused.value.field == "order"
    assert not Feedback.objects.exists()


def test_the_wait_window_falls_back_to_the_automatic_reward(owner: User) -> None:
    run = make_run(owner=owner, feedback={"mode": "blend", "w_auto": 0.5, "w_human": 0.5, "wait_seconds": 60})
    members = _group(run, autos=[1.0, 0.0])
    feedback_rate(run=run, author=owner, experience=members[0], score=1)
    assert feedback_wait_expire().groups_ready == 0  # the window is still open
    later = timezone.now() + timedelta(seconds=61)
    assert feedback_wait_expire(now=later).groups_ready == 1
    rated, unrated = _fresh(members)
    assert (rated.status, rated.reward) == ("ready", pytest.approx(0.5 * 1.0 + 0.5 * 0.0))
    assert (unrated.status, unrated.reward) == ("ready", 0.0)
    assert feedback_wait_expire(now=later).groups_ready == 0  # idempotent


def test_at_the_wait_windows_end_unrated_members_stand_on_the_rated_siblings_scale(owner: User) -> None:
    """An unrated member's fallback is blended like its rated siblings' rewards, with their
    mean human reward standing in for its own: with a format-only automatic reward (1.0 for
    all) it sits between a rated right (5) and a rated wrong (1) answer, not above both."""
    run = make_run(owner=owner, feedback={"mode": "blend", "w_auto": 0.2, "w_human": 1.0, "wait_seconds": 0})
    members = _group(run, autos=[1.0, 1.0, 1.0, 1.0])
    feedback_rate(run=run, author=owner, experience=members[0], score=5)
    feedback_rate(run=run, author=owner, experience=members[1], score=1)
    assert feedback_wait_expire().groups_ready == 1
    right, wrong, *unrated = _fresh(members)
    assert (right.reward, wrong.reward) == (pytest.approx(1.2), pytest.approx(0.2))
    assert [m.reward for m in unrated] == [pytest.approx(0.2 * 1.0 + 1.0 * 0.5)] * 2
    assert {m.status for m in _fresh(members)} == {"ready"}
    # A group no one rated trains on the automatic reward alone, as before.
    alone = _group(run, autos=[1.0, 0.0], group="g2")
    assert feedback_wait_expire().groups_ready == 1
    assert [m.reward for m in _fresh(alone)] == [1.0, 0.0]


def test_the_drop_fallback_filters_the_whole_group_with_a_reason(owner: User) -> None:
    run = make_run(owner=owner, feedback={"mode": "human", "wait_seconds": 0, "fallback": "drop"})
    members = _group(run, autos=[1.0, 1.0])
    feedback_rate(run=run, author=owner, experience=members[0], score=4)
    assert feedback_wait_expire().groups_dropped == 1
    assert {(m.status, m.filter_reason) for m in _fresh(members)} == {("filtered", DROP_REASON)}


def test_late_feedback_is_stored_counted_and_leaves_the_trained_reward_alone(owner: User) -> None:
    run = make_run(owner=owner, feedback={"mode": "blend"})
    members = _group(run, autos=[1.0, 0.0], status="ready")
    Experience.objects.filter(pk__in=[m.pk for m in members]).update(reward=0.7)
    claimed = batch_claim(run=run, worker="t", size=10)
    batch_ack(run=run, worker="t", ids=[e.pk for e in claimed])
    rating = feedback_rate(run=run, author=owner, experience=members[0], score=1)
    pair = feedback_compare(run=run, author=owner, experience=members[0], other=members[1], winner="b")
    assert rating.late and pair.late
    assert {(m.status, m.reward) for m in _fresh(members)} == {("consumed", 0.7)}
    assert feedback_counts(run=run)["late"] == 2
    [dpo] = dpo_pairs(run=run)
    assert (dpo.chosen_id, dpo.rejected_id, dpo.late) == (members[1].pk, members[0].pk, True)
    assert dpo_pairs(run=run, include_late=False) == []


def test_auto_mode_keeps_the_automatic_reward_but_records_the_human_one(owner: User) -> None:
    run = make_run(owner=owner)
    (member,) = _group(run, autos=[1.0], status="ready")
    Experience.objects.filter(pk=member.pk).update(reward=1.0)
    feedback_rate(run=run, author=owner, experience=member, thumb="down")
    (after,) = _fresh([member])
    assert (after.status, after.reward, after.human_reward) == ("ready", 1.0, 0.0)


def test_an_edit_becomes_an_expert_experience_written_once(owner: User) -> None:
    run = make_run(owner=owner)
    (member,) = _group(run, autos=[0.0], status="ready")
    fb, expert = feedback_edit(run=run, author=owner, experience=member, text="The answer is 4.")
    again, same = feedback_edit(run=run, author=owner, experience=member, text="The answer is 4.")
    assert (again.pk, same.pk) == (fb.pk, expert.pk)
    assert expert.is_expert and expert.parent_id == member.pk and expert.source == "human"
    assert (expert.response_text, expert.prompt_text, expert.status) == ("The answer is 4.", member.prompt_text, "ready")
    assert fb.kind == "edit" and fb.value == {"expert_id": expert.pk}
    assert batch_claim(run=run, worker="sft", size=5, expert=True) == [expert]


def test_a_rating_of_a_correction_or_of_a_row_gone_meanwhile_reads_the_row_itself(owner: User) -> None:
    # A rating given the row itself takes its group from it and reads it once, under the
    # group's lock: a correction is in no group's members, and a row deleted since the page
    # read it must still be refused, not stored against nothing.
    run = make_run(owner=owner)
    member, sibling = _group(run, autos=[0.0, 1.0])
    _, expert = feedback_edit(run=run, author=owner, experience=member, text="The answer is 4.")
    rated = feedback_rate(run=run, author=owner, experience=expert, score=5)
    assert rated.experience_id == expert.pk and rated.group_id == expert.group_id
    Experience.objects.filter(pk=sibling.pk).delete()
    with pytest.raises(NotFound, match="not an experience of run"):
        feedback_rate(run=run, author=owner, experience=sibling, score=3)
    assert Feedback.objects.filter(kind="rating").count() == 1


def test_malformed_feedback_is_refused_with_a_message(owner: User) -> None:
    run = make_run(owner=owner)
    other_run = make_run(owner=owner, name="other")
    (member,) = _group(run, autos=[0.0])
    (foreign,) = _group(other_run, autos=[0.0], group="g2")
    with pytest.raises(InvalidInput, match="1 to 5"):
        feedback_rate(run=run, author=owner, experience=member, score=9)
    with pytest.raises(NotFound, match="not an experience of run"):
        feedback_rate(run=run, author=owner, experience=foreign, score=3)
    with pytest.raises(InvalidInput, match="flags"):
        feedback_rate_and_flag(run=run, author=owner, experience=member, flags=["boring"])
    assert not Feedback.objects.exists()


def test_flags_are_stored_beside_the_rating(owner: User) -> None:
    user = make_user("rater")
    run = make_run(owner=owner)
    (member,) = _group(run, autos=[0.0])
    saved = feedback_rate_and_flag(run=run, author=user, experience=member, score=2, flags=["unsafe", "off_task"],
                                   comment="bad")
    assert [(f.kind, f.value.get("flags")) for f in saved] == [("rating", None), ("flag", ["off_task", "unsafe"])]
    assert saved[0].comment == "bad"
