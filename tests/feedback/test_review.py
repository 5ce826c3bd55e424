"""The owner's review of labels (issue 32 item 5, from Argilla / Label Studio), at the services:
a rejected label takes no effect (its group's reward, the reward model's training pairs, the
exports), accepting is recorded, and a disagreement between people is resolved by keeping one
side or by the owner's own label."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User

from apps.buffer.models import Experience
from apps.feedback import ports
from apps.feedback.training_data import export_rows
from apps.feedback.models import Assignment, Feedback
from apps.feedback.review.services import disagreement_answer, disagreement_resolve, feedback_accept, feedback_reject
from apps.feedback.review.selectors import disagreements
from apps.feedback.handout.lease import assignment_claim
from apps.feedback.kinds.edit import feedback_edit
from apps.feedback.kinds.pairwise import feedback_compare
from apps.feedback.kinds.ranking import feedback_rank
from apps.feedback.kinds.rating import feedback_rate
from apps.runs.models import AuditEntry, Run
from apps.runs.ports import run_view_of
from kernel.exceptions import Conflict, InvalidInput, NotFound
from tests.factories import add_member, make_experiences, make_run, make_taskset, make_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def people(owner: User) -> dict[str, User]:
    return {"owner": owner, "annie": make_user("annie"), "bea": make_user("bea")}


def a_run(people: dict[str, User], **feedback: Any) -> Run:
    run = make_run(owner=people["owner"], taskset=make_taskset(owner=people["owner"]), name="reviewed",
                   feedback={"mode": "human", "overlap": 1, **feedback})
    add_member(run, people["annie"])
    add_member(run, people["bea"])
    return run


def fresh(exp: Experience) -> Experience:
    return Experience.objects.get(pk=exp.pk)


def rm_pairs(run: Run) -> set[tuple[int, int]]:
    """What the reward model's trainer reads: the preference pairs through the feedback port."""
    return {(p.chosen_id, p.rejected_id) for p in ports.preference_pairs(run=run_view_of(run))}


def exported(run: Run, export_format: str) -> list[dict[str, Any]]:
    return list(export_rows(run=run, export_format=export_format))


def annie_rates_a_pair(run: Run, people: dict[str, User], *, bad_score: int = 1) -> tuple[Experience, Experience, Feedback]:
    """A group of two fresh completions that annie rated 5 and `bad_score`: (good, bad, the bad one's label)."""
    good, bad = make_experiences(run, groups=1, group_size=2, status="pending", reward=None)
    feedback_rate(run=run, experience=good, score=5, author=people["annie"])
    return good, bad, feedback_rate(run=run, experience=bad, score=bad_score, author=people["annie"])


def test_a_rejected_rating_leaves_its_groups_reward_the_reward_models_pairs_and_the_export(
        people: dict[str, User]) -> None:
    run = a_run(people)
    good, bad, wrong = annie_rates_a_pair(run, people)
    assert fresh(bad).reward == 0.0 and fresh(good).status == Experience.Status.READY
    assert rm_pairs(run) == {(good.pk, bad.pk)}
    assert len(exported(run, "preferences")) == 1

    outcome = feedback_reject(run=run, feedback_id=wrong.pk, reviewer=people["owner"])

    assert "taken out of its group's reward" in outcome.effect and not outcome.trained
    # The rating no longer folds: the member waits for people again, and so does its group.
    assert fresh(bad).human_reward is None and fresh(bad).status == Experience.Status.PENDING
    assert fresh(good).human_reward == 1.0 and fresh(good).status == Experience.Status.PENDING
    # One rated member makes no pair: the reward model and the export lose it.
    assert rm_pairs(run) == set()
    assert exported(run, "preferences") == []
    # Recorded and audited.
    row = Feedback.objects.get(pk=wrong.pk)
    assert row.review == "rejected" and row.reviewed_by == people["owner"] and row.reviewed_at is not None
    entry = AuditEntry.objects.get(run=run, action="label_reject")
    assert entry.actor == people["owner"] and entry.detail["feedback"] == wrong.pk and entry.detail["author"] == "annie"


def test_a_rejected_label_frees_its_item_for_someone_else(people: dict[str, User]) -> None:
    run = a_run(people)
    [item] = make_experiences(run, groups=1, group_size=1, status="pending", reward=None)
    [mine] = assignment_claim(run=run, annotator=people["annie"], size=1)
    label = feedback_rate(run=run, experience=item, score=1, author=people["annie"])
    assert assignment_claim(run=run, annotator=people["bea"], size=1) == []  # overlap 1: taken

    assert "back to the queue" in feedback_reject(run=run, feedback_id=label.pk, reviewer=people["owner"]).effect

    assert Assignment.objects.get(pk=mine.pk).status == Assignment.Status.SKIPPED
    assert [a.experience_id for a in assignment_claim(run=run, annotator=people["bea"], size=1)] == [item.pk]


def test_accepting_a_rejected_label_puts_it_back(people: dict[str, User]) -> None:
    run = a_run(people)
    good, bad, label = annie_rates_a_pair(run, people, bad_score=2)
    feedback_reject(run=run, feedback_id=label.pk, reviewer=people["owner"])

    outcome = feedback_accept(run=run, feedback_id=label.pk, reviewer=people["owner"])

    assert "back in its group's reward" in outcome.effect
    assert fresh(bad).human_reward == 0.25 and fresh(bad).status == Experience.Status.READY
    assert rm_pairs(run) == {(good.pk, bad.pk)}
    assert list(AuditEntry.objects.filter(run=run).values_list("action", flat=True).order_by("id"))[-2:] == [
        "label_reject", "label_accept"]
    # Accepting twice changes nothing and says so.
    assert feedback_accept(run=run, feedback_id=label.pk, reviewer=people["owner"]).effect == "already accepted"


def test_a_rejection_after_the_group_trained_keeps_the_reward_it_taught_and_leaves_every_later_read(
        people: dict[str, User]) -> None:
    run = a_run(people)
    good, bad, label = annie_rates_a_pair(run, people)
    Experience.objects.filter(pk__in=[good.pk, bad.pk]).update(status=Experience.Status.CONSUMED)  # trained on

    outcome = feedback_reject(run=run, feedback_id=label.pk, reviewer=people["owner"])

    assert outcome.trained and "that reward stays in the versions trained on it" in outcome.effect
    assert fresh(bad).reward == 0.0 and fresh(bad).human_reward == 0.0  # what the trainer saw stays
    assert rm_pairs(run) == set() and exported(run, "preferences") == []


def test_a_rejected_comparison_leaves_dpo_and_the_reward_models_pairs(people: dict[str, User]) -> None:
    run = a_run(people, mode="auto")
    a, b = make_experiences(run, groups=1, group_size=2)
    choice = feedback_compare(run=run, experience=a, other=b, winner="a", author=people["bea"])
    dpo_before = exported(run, "dpo")
    assert (a.pk, b.pk) in rm_pairs(run)

    outcome = feedback_reject(run=run, feedback_id=choice.pk, reviewer=people["owner"])

    assert "left out of the reward model's preference pairs and the exports" in outcome.effect
    assert rm_pairs(run) == set()
    assert len(exported(run, "dpo")) == len(dpo_before) - 1


def test_a_rejected_correction_leaves_the_buffer_and_the_sft_export(people: dict[str, User]) -> None:
    run = a_run(people, mode="auto")
    [original] = make_experiences(run, groups=1, group_size=1)
    edit, expert = feedback_edit(run=run, author=people["annie"], experience=original, text="a corrected answer")
    assert any(r["messages"][-1]["content"] == "a corrected answer" for r in exported(run, "sft"))

    outcome = feedback_reject(run=run, feedback_id=edit.pk, reviewer=people["owner"])

    assert "filtered out of training" in outcome.effect
    assert fresh(expert).status == Experience.Status.FILTERED
    assert not any(r["messages"][-1]["content"] == "a corrected answer" for r in exported(run, "sft"))
    assert (expert.pk, original.pk) not in rm_pairs(run)
    feedback_accept(run=run, feedback_id=edit.pk, reviewer=people["owner"])
    assert fresh(expert).status == Experience.Status.READY


def test_a_label_of_another_run_or_an_environments_reward_is_not_reviewed_here(people: dict[str, User]) -> None:
    run, elsewhere = a_run(people), a_run(people)
    [exp] = make_experiences(elsewhere, groups=1, group_size=1, status="pending", reward=None)
    theirs = feedback_rate(run=elsewhere, experience=exp, score=3, author=people["annie"])
    with pytest.raises(NotFound) as missing:
        feedback_reject(run=run, feedback_id=theirs.pk, reviewer=people["owner"])
    assert missing.value.field == "feedback_id"
    assert Feedback.objects.get(pk=theirs.pk).review == "pending"


# --- disagreements ----------------------------------------------------------------------------


def test_ratings_far_apart_are_a_disagreement_resolved_by_keeping_one_side(people: dict[str, User]) -> None:
    run = a_run(people, mode="blend", overlap=2)
    item, other = make_experiences(run, groups=1, group_size=2, status="pending", reward=None, auto_reward=0.0)
    annies = feedback_rate(run=run, experience=item, score=5, author=people["annie"])
    beas = feedback_rate(run=run, experience=item, score=1, author=people["bea"])
    feedback_rate(run=run, experience=other, score=3, author=people["annie"])
    feedback_rate(run=run, experience=other, score=4, author=people["bea"])  # close enough: agreement

    [found] = disagreements(run=run)
    assert {f.pk for f in found.labels} == {annies.pk, beas.pk}
    assert "annie 5/5, bea 1/5" in found.conflicts[0].why
    assert fresh(item).human_reward == 0.5

    resolution = disagreement_resolve(run=run, group_id=item.group_id, keep=annies.pk, reviewer=people["owner"])

    assert resolution.kept.feedback.review == "accepted"
    assert [o.feedback.pk for o in resolution.rejected] == [beas.pk]
    assert fresh(item).human_reward == 1.0  # only annie's rating folds now
    assert disagreements(run=run) == []
    with pytest.raises(Conflict):
        disagreement_resolve(run=run, group_id=item.group_id, keep=annies.pk, reviewer=people["owner"])


def test_opposite_choices_and_a_ranking_against_a_rating_are_disagreements(people: dict[str, User]) -> None:
    run = a_run(people, mode="auto")
    a, b = make_experiences(run, groups=1, group_size=2)
    feedback_compare(run=run, experience=a, other=b, winner="a", author=people["annie"])
    feedback_compare(run=run, experience=b, other=a, winner="a", author=people["bea"])  # b over a
    x, y, z = make_experiences(run, groups=1, group_size=3)
    feedback_rank(run=run, order=[x.pk, y.pk, z.pk], author=people["annie"])
    feedback_rate(run=run, experience=x, score=1, author=people["bea"])  # annie's best is bea's worst

    found = {d.group_id: d for d in disagreements(run=run)}
    assert set(found) == {a.group_id, x.group_id}
    assert f"annie prefers #{a.pk} to #{b.pk}, bea #{b.pk} to #{a.pk}" in found[a.group_id].conflicts[0].why
    assert found[a.group_id].pairs == [(a.pk, b.pk)]
    assert "annie ranked 1 of 3, bea 1/5" in found[x.group_id].conflicts[0].why


def test_the_owner_resolves_a_disagreement_with_their_own_label(people: dict[str, User]) -> None:
    run = a_run(people, mode="blend", overlap=2)
    [item] = make_experiences(run, groups=1, group_size=1, status="pending", reward=None, auto_reward=0.0)
    annies = feedback_rate(run=run, experience=item, score=5, author=people["annie"])
    beas = feedback_rate(run=run, experience=item, score=1, author=people["bea"])

    with pytest.raises(InvalidInput) as bad:
        disagreement_answer(run=run, group_id=item.group_id, reviewer=people["owner"], experience_id=item.pk)
    assert bad.value.field == "score"
    resolution = disagreement_answer(run=run, group_id=item.group_id, reviewer=people["owner"],
                                     experience_id=item.pk, score=4)

    assert resolution.kept.feedback.author == people["owner"] and resolution.kept.feedback.review == "accepted"
    assert [o.feedback.pk for o in resolution.rejected] == [beas.pk]  # 4 and 5 agree; 1 does not
    assert Feedback.objects.get(pk=annies.pk).review == "pending"
    assert fresh(item).human_reward == pytest.approx((1.0 + 0.75) / 2)
    assert disagreements(run=run) == []
