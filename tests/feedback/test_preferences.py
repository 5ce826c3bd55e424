"""Preference pairs from every kind of feedback: the right pairs, in the right direction."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth.models import User
from django.test import Client

from apps.buffer.models import Experience
from apps.buffer.services import experience_write
from apps.feedback.reward_model.preferences import pair_is_heldout, preference_pairs, preference_rows_trl
from apps.feedback.kinds.edit import feedback_edit
from apps.feedback.kinds.pairwise import feedback_compare
from apps.feedback.kinds.ranking import feedback_rank
from apps.feedback.kinds.rating import feedback_rate
from apps.runs.models import Run
from tests.factories import add_member, experience_row, make_run

pytestmark = pytest.mark.django_db


def _group(run: Run, n: int, group: str = "g1", status: str = "pending") -> list[Experience]:
    rows = [experience_row(run, key=f"{group}-{i}", group=group, status=status, auto_reward=0.5, reward=None,
                           prompt_text=f"prompt of {group}", response_text=f"answer {group} {i}") for i in range(n)]
    ids = experience_write(experiences=rows).ids
    return list(Experience.objects.filter(pk__in=ids).order_by("id"))


def _as_ids(run: Run) -> list[tuple[str, int, int]]:
    return sorted((p.kind, p.chosen_id, p.rejected_id) for p in preference_pairs(run=run))


@pytest.fixture
def blend_run(owner: User, annotator: User) -> Run:
    run = make_run(owner=owner, feedback={"mode": "blend", "overlap": 2})
    add_member(run, annotator)
    return run


def test_ratings_within_a_group_prefer_the_higher_rated_member(blend_run: Run, owner: User, annotator: User) -> None:
    a, b, c = _group(blend_run, 3)
    feedback_rate(run=blend_run, author=annotator, experience=a, score=2)
    feedback_rate(run=blend_run, author=annotator, experience=b, score=5)
    feedback_rate(run=blend_run, author=annotator, experience=c, score=2)  # ties with a: no pair
    pairs = preference_pairs(run=blend_run)
    assert sorted((p.chosen_id, p.rejected_id) for p in pairs) == [(b.pk, a.pk), (b.pk, c.pk)]
    assert all(p.kind == "rating" and p.margin == pytest.approx(0.75) for p in pairs)
    assert pairs[0].chosen == b.response_text and pairs[0].prompt == b.prompt_text


def test_ratings_pool_raters_and_never_pair_across_groups(blend_run: Run, owner: User, annotator: User) -> None:
    a, b = _group(blend_run, 2, group="g1")
    (x,) = _group(blend_run, 1, group="g2")
    # a: mean of 5 and 1 = 0.5; b: 4 -> 0.75: b beats a once the two raters are pooled.
    feedback_rate(run=blend_run, author=annotator, experience=a, score=5)
    feedback_rate(run=blend_run, author=owner, experience=a, score=1)
    feedback_rate(run=blend_run, author=owner, experience=b, score=4)
    feedback_rate(run=blend_run, author=owner, experience=x, score=5)  # alone in its group
    assert _as_ids(blend_run) == [("rating", b.pk, a.pk)]


def test_a_ranking_gives_every_ordered_pair_best_first(blend_run: Run, annotator: User) -> None:
    a, b, c = _group(blend_run, 3)
    feedback_rank(run=blend_run, author=annotator, group_id="g1", order=[c.pk, a.pk, b.pk])
    assert _as_ids(blend_run) == sorted([("ranking", c.pk, a.pk), ("ranking", c.pk, b.pk), ("ranking", a.pk, b.pk)])


def test_a_comparison_prefers_its_winner_and_a_tie_gives_nothing(blend_run: Run, owner: User, annotator: User) -> None:
    a, b = _group(blend_run, 2)
    feedback_compare(run=blend_run, author=annotator, experience=a, other=b, winner="b")
    feedback_compare(run=blend_run, author=owner, experience=a, other=b, winner="tie")
    assert _as_ids(blend_run) == [("pairwise", b.pk, a.pk)]


def test_an_edit_beats_its_original(blend_run: Run, annotator: User) -> None:
    (a,) = _group(blend_run, 1)
    _, expert = feedback_edit(run=blend_run, author=annotator, experience=a, text="<answer>2</answer> fixed")
    (pair,) = preference_pairs(run=blend_run)
    assert (pair.kind, pair.chosen_id, pair.rejected_id) == ("edit", expert.pk, a.pk)
    assert pair.chosen == "<answer>2</answer> fixed" and pair.rejected == a.response_text


def test_pairs_from_the_browser_doors_match_the_service(blend_run: Run, annotator: User) -> None:
    """The annotation page's compare and rank forms store what preference_pairs reads."""
    a, b, c = _group(blend_run, 3)
    client = Client()
    client.force_login(annotator)
    base = f"/runs/{blend_run.pk}/annotate/experiences"
    assert client.post(f"{base}/{a.pk}/compare/", {"other": b.pk, "winner": "a"}).status_code in (200, 302)
    ranks = {f"rank_{a.pk}": "3", f"rank_{b.pk}": "1", f"rank_{c.pk}": "2"}
    assert client.post(f"{base}/{a.pk}/rank/", ranks).status_code in (200, 302)
    assert _as_ids(blend_run) == sorted([
        ("pairwise", a.pk, b.pk), ("ranking", b.pk, c.pk), ("ranking", b.pk, a.pk), ("ranking", c.pk, a.pk)])


def test_rater_weights_decide_a_rating_pair(blend_run: Run, owner: User, annotator: User) -> None:
    a, b = _group(blend_run, 2)
    feedback_rate(run=blend_run, author=annotator, experience=a, score=5)
    feedback_rate(run=blend_run, author=annotator, experience=b, score=1)
    feedback_rate(run=blend_run, author=owner, experience=a, score=1)
    feedback_rate(run=blend_run, author=owner, experience=b, score=4)
    (trusting_owner,) = preference_pairs(run=blend_run, rater_weights={annotator.pk: 0.1, owner.pk: 1.0})
    (trusting_annotator,) = preference_pairs(run=blend_run, rater_weights={annotator.pk: 1.0, owner.pk: 0.1})
    assert (trusting_owner.chosen_id, trusting_annotator.chosen_id) == (b.pk, a.pk)


def test_held_out_split_keeps_a_prompt_together_and_roughly_its_share(blend_run: Run, annotator: User) -> None:
    pairs = []
    for g in range(60):
        x, y = _group(blend_run, 2, group=f"h{g}")
        feedback_compare(run=blend_run, author=annotator, experience=x, other=y, winner="a")
        feedback_rank(run=blend_run, author=annotator, group_id=f"h{g}", order=[y.pk, x.pk])
    pairs = preference_pairs(run=blend_run)
    by_prompt: dict[str, set[bool]] = {}
    for p in pairs:
        by_prompt.setdefault(p.prompt, set()).add(pair_is_heldout(p, share=0.25))
    assert all(len(v) == 1 for v in by_prompt.values())
    held = sum(1 for v in by_prompt.values() if True in v)
    assert 5 <= held <= 25


def test_trl_rows_have_prompt_chosen_rejected(blend_run: Run, annotator: User) -> None:
    a, b = _group(blend_run, 2)
    feedback_compare(run=blend_run, author=annotator, experience=a, other=b, winner="a")
    (row,) = preference_rows_trl(preference_pairs(run=blend_run))
    assert {"prompt", "chosen", "rejected"} <= set(row)
    assert (row["prompt"], row["chosen"], row["rejected"]) == (a.prompt_text, a.response_text, b.response_text)
    json.dumps(row)


def test_each_pair_names_the_labels_it_came_from_and_the_rest_say_why_not(
        blend_run: Run, owner: User, annotator: User) -> None:
    """Issue 62: what a reward-model version records. A rating pair comes from the ratings of
    both its members (pooled raters included); a ranking, A/B choice or edit pair from its one
    row; a lone rating, a tie and a gold item's label make none, and say so."""
    from apps.feedback.reward_model.preferences import preference_pairs_read

    a, b, c = _group(blend_run, 3, group="g1")
    ra = feedback_rate(run=blend_run, author=annotator, experience=a, score=2)
    rb1 = feedback_rate(run=blend_run, author=annotator, experience=b, score=5)
    rb2 = feedback_rate(run=blend_run, author=owner, experience=b, score=4)
    (x, y) = _group(blend_run, 2, group="g2")
    lone = feedback_rate(run=blend_run, author=owner, experience=x, score=5)
    tie = feedback_compare(run=blend_run, author=owner, experience=x, other=y.pk, winner="tie")
    choice = feedback_compare(run=blend_run, author=annotator, experience=x, other=y.pk, winner="b")
    rank = feedback_rank(run=blend_run, author=owner, order=[c.pk, a.pk, b.pk])
    gold = feedback_compare(run=blend_run, author=owner, experience=a, other=c.pk, winner="a")
    read = preference_pairs_read(run=blend_run, exclude_experience_ids=set())
    by_ids = {(p.kind, p.chosen_id, p.rejected_id): p.feedback_ids for p in read.pairs}
    assert by_ids[("rating", b.pk, a.pk)] == tuple(sorted((ra.pk, rb1.pk, rb2.pk)))
    assert by_ids[("pairwise", y.pk, x.pk)] == (choice.pk,)
    assert {by_ids[("ranking", c.pk, a.pk)], by_ids[("ranking", a.pk, b.pk)]} == {(rank.pk,)}
    assert read.unpaired == {lone.pk: "lone", tie.pk: "no_pair"}
    # With c a gold item: the ranking and the choice that name it make no pair, as gold.
    read = preference_pairs_read(run=blend_run, exclude_experience_ids={c.pk})
    assert read.unpaired == {lone.pk: "lone", tie.pk: "no_pair", rank.pk: "gold", gold.pk: "gold"}
