"""Asking for, voting on and closing a blind evaluation through its services: the answers
cache, the planted checks, each pair's votes from different people, nobody shown a pair twice,
and the refusals (lost access: not found; closed: conflict). Votes are no feedback."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from apps.evaluation.models import Answer, Evaluation, Vote
from apps.evaluation.ports import answers_needed
from apps.evaluation.selectors import evaluations_to_vote, next_item
from apps.evaluation.services import VersionRef, evaluation_close, evaluation_create, vote_cast
from apps.feedback.models import Feedback
from apps.runs.models import Run, RunMember
from kernel.exceptions import Conflict, InvalidInput, NotAllowed, NotFound
from tests.evaluation.conftest import MakeEvaluation, answer_all, publish
from tests.factories import add_member, make_run, make_taskset, make_user

pytestmark = pytest.mark.django_db


def test_defaults_compare_the_start_with_the_newest_on_the_eval_taskset_and_answers_are_cached(owner: User) -> None:
    evalset = make_taskset(8, owner=owner, name="held-out")
    run = publish(make_run(owner=owner, taskset=make_taskset(owner=owner), eval={"taskset": evalset.pk}), 1, 3)
    first = evaluation_create(run=run, by=owner, prompt_count=5, seed=11)
    assert first.status == Evaluation.Status.GENERATING and first.seed == 11
    assert [(e.run_id, e.number) for e in first.entrants.all()] == [(run.pk, 0), (run.pk, 3)]
    texts = [p.text for p in first.prompts.all()]
    assert len(texts) == 5 and set(texts) <= set(evalset.tasks.values_list("prompt", flat=True))
    assert len(answers_needed(evaluation_id=first.pk) or []) == 10
    answer_all(first)
    # The same versions, prompts and seed: every answer is cached, so it opens at once.
    second = evaluation_create(run=run, by=owner, prompt_count=5, seed=11)
    assert second.status == Evaluation.Status.OPEN and Answer.objects.count() == 10
    # A check per ten prompts (at least one): the same answer on both sides.
    checks = list(second.items.filter(is_check=True))
    assert len(checks) == 1 and checks[0].left_answer_id == checks[0].right_answer_id
    assert second.items.filter(is_check=False).count() == 5


def test_bad_requests_are_named(owner: User, annotator: User, run: Run) -> None:
    with pytest.raises(InvalidInput, match="published no version"):
        evaluation_create(run=run, by=owner, prompts=["x"])
    publish(run, 1)
    with pytest.raises(InvalidInput, match="no evaluation taskset"):
        evaluation_create(run=run, by=owner)
    with pytest.raises(InvalidInput, match="no published version 9"):
        evaluation_create(run=run, by=owner, prompts=["x"], versions=[VersionRef(0), VersionRef(9)])
    with pytest.raises(InvalidInput, match="not people of this run: nobody"):
        evaluation_create(run=run, by=owner, prompts=["x"], voters=["nobody"])
    with pytest.raises(NotAllowed):
        evaluation_create(run=run, by=annotator, prompts=["x"])
    hidden = publish(make_run(owner=make_user("stranger")), 1)
    with pytest.raises(NotFound):
        evaluation_create(run=run, by=owner, prompts=["x"], versions=[VersionRef(0), VersionRef(1, hidden.pk)])


def test_another_runs_version_the_owner_can_see(owner: User, run: Run) -> None:
    twin = publish(make_run(owner=owner, name="twin"), 4)
    publish(run, 1)
    evaluation = answer_all(evaluation_create(run=run, by=owner, prompts=["p"], versions=[
        VersionRef(1), VersionRef(4, twin.pk)]))
    assert [e.label(run.pk) for e in evaluation.entrants.all()] == ["v1", f"run {twin.pk} v4"]


def test_each_pair_gets_votes_from_different_people_and_nobody_sees_one_twice(
        make_evaluation: MakeEvaluation, owner: User, annotator: User) -> None:
    evaluation = make_evaluation(prompts=3, votes_per_pair=1)
    seen: list[str] = []
    while (shown := next_item(evaluation=evaluation, user=annotator)) is not None:
        assert shown.token not in seen
        seen.append(shown.token)
        assert shown.progress.done == len(seen) - 1
        vote_cast(evaluation=evaluation, token=shown.token, voter=annotator, choice="tie")
    assert len(seen) == evaluation.items.count() == 4
    with pytest.raises(Conflict, match="already voted"):
        vote_cast(evaluation=evaluation, token=seen[0], voter=annotator, choice="left")
    # The owner sees only the planted check: every pair has its one vote.
    owner_sees = next_item(evaluation=evaluation, user=owner)
    assert owner_sees is not None and evaluation.items.get(token=owner_sees.token).is_check
    pair = evaluation.items.filter(is_check=False).first()
    assert pair is not None
    with pytest.raises(Conflict, match="all its votes"):
        vote_cast(evaluation=evaluation, token=pair.token, voter=owner, choice="left")


def test_lost_access_is_not_found_closed_is_a_conflict_and_votes_are_no_feedback(
        make_evaluation: MakeEvaluation, owner: User, annotator: User, outsider: User) -> None:
    evaluation = make_evaluation(prompts=2)
    shown = next_item(evaluation=evaluation, user=annotator)
    assert shown is not None
    with pytest.raises(NotFound):
        vote_cast(evaluation=evaluation, token=shown.token, voter=outsider, choice="left")
    with pytest.raises(InvalidInput, match="choice"):
        vote_cast(evaluation=evaluation, token=shown.token, voter=annotator, choice="middle")
    vote_cast(evaluation=evaluation, token=shown.token, voter=annotator, choice="left", comment="  clearer  ")
    assert Vote.objects.get().comment == "clearer" and Feedback.objects.count() == 0
    RunMember.objects.filter(user=annotator).delete()
    following = evaluation.items.exclude(token=shown.token).first()
    assert following is not None
    with pytest.raises(NotFound):
        vote_cast(evaluation=evaluation, token=following.token, voter=annotator, choice="left")
    evaluation_close(evaluation=evaluation, by=owner)
    with pytest.raises(Conflict, match="closed"):
        vote_cast(evaluation=evaluation, token=following.token, voter=owner, choice="left")
    with pytest.raises(Conflict):
        evaluation_close(evaluation=evaluation, by=owner)


def test_named_voters_only_and_the_list_of_evaluations_to_vote(make_evaluation: MakeEvaluation, owner: User,
                                                               annotator: User) -> None:
    anna = make_user("anna")
    add_member(Run.objects.get(), anna)
    evaluation = make_evaluation(prompts=2, voters=["anna"])
    item = evaluation.items.first()
    assert item is not None
    with pytest.raises(NotAllowed):
        vote_cast(evaluation=evaluation, token=item.token, voter=annotator, choice="left")
    assert evaluations_to_vote(user=anna) == [evaluation] and evaluations_to_vote(user=annotator) == []
