"""Why each item was handed out (`Assignment.source`), recorded at the annotation page's claim:
the selection rule's pick, its random share, a gold turn, or plain arrival order, so the
reward model's accuracy can be read on the unbiased share alone (tests/rewards/
test_rm_random_share.py). And the hand-out's random draws are seeded by the run's seed and its
hand-out count: the same claims under the same seed hand out the same items.

Personas: Olga owns the run; Anna annotates (Ben too, where two claim)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from apps.buffer.models import Experience
from apps.buffer.services import experience_write
from apps.feedback.models import Assignment
from apps.rewards.models import GoldItem, RewardModel, RewardModelScore
from apps.runs.models import Run
from tests.factories import add_member, experience_row, make_run, make_user

pytestmark = pytest.mark.django_db


# A rule that weighs nothing (the run config's default before issue 62 made active selection
# the default): the queue goes in arrival order.
ARRIVAL = {"uncertainty": 0.0, "random_share": 0.0}


def _run(olga: User, anna: User, *, seed: int = 0, **feedback: Any) -> Run:
    run = make_run(owner=olga, seed=seed, feedback={"mode": "blend", "overlap": 1, **feedback})
    add_member(run, anna)
    return run


def _groups(run: Run, *, groups: int, size: int = 2, scores: list[float] | None = None) -> list[list[Experience]]:
    """Groups of `size` completions; with `scores`, a reward model scored group g's members
    scores[g] apart around 0 (the largest gap: the pair straddling its decision)."""
    rows = [experience_row(run, key=f"g{g}-{i}", group=f"g{g}", status="pending", reward=None,
                           auto_reward=float(i % 2), response_text=f"answer {g}.{i}")
            for g in range(groups) for i in range(size)]
    exps = list(Experience.objects.filter(pk__in=experience_write(experiences=rows).ids).order_by("id"))
    out = [exps[k:k + size] for k in range(0, len(exps), size)]
    if scores is not None:
        rm = RewardModel.objects.create(run=run, version=1, path="/nowhere", base="x", accuracy=0.9)
        RewardModelScore.objects.bulk_create([
            RewardModelScore(experience=e, reward_model=rm, score=(scores[g] if i == 0 else -scores[g]))
            for g, members in enumerate(out) for i, e in enumerate(members)])
    return out


def _open_page(run: Run, user: User) -> list[Assignment]:
    """The annotator opens the annotation page (the claim door); their new queue, in order."""
    client = Client()
    client.force_login(user)
    before = set(Assignment.objects.filter(run=run, annotator=user).values_list("pk", flat=True))
    assert client.get(f"/runs/{run.pk}/annotate/").status_code == 200
    return list(Assignment.objects.filter(run=run, annotator=user).exclude(pk__in=before)
                .select_related("experience").order_by("id"))


def _rate_queue(run: Run, user: User) -> None:
    client = Client()
    client.force_login(user)
    for a in Assignment.objects.filter(run=run, annotator=user, status="leased"):
        r = client.post(f"/runs/{run.pk}/annotate/items/{a.pk}/rate/", {"score": "3"}, HTTP_HX_REQUEST="true")
        assert r.status_code == 200


def test_without_a_selection_rule_the_page_hands_out_in_arrival_order_and_says_so(olga: User, anna: User) -> None:
    run = _run(olga, anna, selection=ARRIVAL)
    groups = _groups(run, groups=6)
    queue = _open_page(run, anna)
    # Arrival order of what a label can still change: the freshest group first, its members in order.
    assert [a.experience_id for a in queue] == [e.pk for g in reversed(groups) for e in g][:8]
    assert {a.source for a in queue} == {"arrival"}


def test_under_a_rule_each_pair_records_whether_the_rule_or_the_random_share_chose_it(olga: User, anna: User) -> None:
    run = _run(olga, anna, selection={"uncertainty": 1.0, "random_share": 0.5, "pairs": True})
    # Groups 0-3 straddle the model's decision (the rule's first picks); the rest it is sure of.
    groups = _groups(run, groups=20, scores=[0.5] * 4 + [3.0] * 16)
    queue = _open_page(run, anna)
    assert len(queue) == 8
    assert Counter(a.source for a in queue) == {"rule": 4, "random": 4}
    # Both members of a pair carry its source, and the rule's pairs are the straddling groups.
    pairs = list(zip(queue[0::2], queue[1::2], strict=True))
    assert all(a.source == b.source and a.experience.group_id == b.experience.group_id for a, b in pairs)
    straddling = {e.group_id for g in groups[:4] for e in g}
    assert all(a.experience.group_id in straddling for a, _ in pairs if a.source == "rule")


def test_gold_turns_record_gold_and_the_fresh_items_beside_them_arrival(olga: User, anna: User) -> None:
    run = _run(olga, anna, gold_rate=0.25, selection=ARRIVAL)
    groups = _groups(run, groups=10, scores=[0.2 * (10 - g) for g in range(10)])  # the model must not choose
    gold = {e.pk for e in groups[-1] + groups[-2]}
    for pk in gold:
        GoldItem.objects.create(run=run, experience_id=pk, answer=1.0, created_by=olga)
    queue = _open_page(run, anna)
    assert len(queue) == 8
    assert {a.source for a in queue if a.experience_id in gold} == {"gold"}
    assert sum(a.source == "gold" for a in queue) == 2
    # No rule weighs anything: the fresh items go in arrival order (the freshest group first),
    # not by the model's margins.
    fresh = [a for a in queue if a.experience_id not in gold]
    assert {a.source for a in fresh} == {"arrival"}
    assert [a.experience_id for a in fresh] == [e.pk for g in reversed(groups[:-2]) for e in g][:6]


def test_a_new_annotator_under_trust_gets_gold_first_recorded_as_gold(olga: User, anna: User) -> None:
    run = _run(olga, anna, rater_weighting="gold", trust={"gold_first": 3},
               selection={"uncertainty": 1.0, "random_share": 0.5})
    groups = _groups(run, groups=10, scores=[0.5] * 10)
    for e in groups[-1] + groups[-2]:
        GoldItem.objects.create(run=run, experience=e, answer=1.0, created_by=olga)
    queue = _open_page(run, anna)
    assert len(queue) == 3 and {a.source for a in queue} == {"gold"}


def _handed(run: Run, user: User) -> list[tuple[str, str]]:
    """What the page handed out over two visits (rating the first queue in between), by key."""
    out = []
    for _ in range(2):
        out += [(a.experience.key, a.source) for a in _open_page(run, user)]
        _rate_queue(run, user)
    return out


def test_the_same_seed_hands_out_the_same_items_and_another_seed_others(olga: User, anna: User) -> None:
    config = {"gold_rate": 0.25, "selection": {"variance": 1.0, "random_share": 0.5, "pairs": True}}
    handed = {}
    for name, seed in (("first", 7), ("again", 7), ("other", 8)):
        # Another account each time, the run's first annotator each time (as bench/steering's).
        person = anna if name == "first" else make_user(f"anna-{name}")
        run = _run(olga, person, seed=seed, **config)
        groups = _groups(run, groups=24, size=4)  # no model: the rule's pairs are drawn too
        for e in groups[-1] + groups[-2]:
            GoldItem.objects.create(run=run, experience=e, answer=1.0, created_by=olga)
        handed[name] = _handed(run, person)
    assert len(handed["first"]) == 16 and {s for _, s in handed["first"]} == {"rule", "random", "gold"}
    assert handed["again"] == handed["first"]
    assert handed["other"] != handed["first"]


def test_two_annotators_claiming_at_the_same_count_draw_different_sequences(olga: User, anna: User) -> None:
    from apps.feedback.handout.lease import handout_rng

    run = _run(olga, anna, selection={"random_share": 1.0})
    ben = make_user("ben")
    add_member(run, ben)
    draws = {u.username: handout_rng(run=run, annotator=u, stream="order").random() for u in (anna, ben, olga)}
    assert len(set(draws.values())) == 3
    assert handout_rng(run=run, annotator=anna, stream="order").random() == draws["anna"]


def test_rows_from_before_the_source_was_recorded_get_it_where_the_config_says_it_for_sure(
        olga: User, anna: User) -> None:
    import importlib

    from django.apps import apps as django_apps

    migration = importlib.import_module("apps.feedback.migrations.0004_assignment_source")
    plain = _run(olga, anna, selection=ARRIVAL)  # as a run of then stored its config
    ruled = _run(olga, anna, selection={"uncertainty": 1.0, "random_share": 0.2})
    rows = {}
    for run in (plain, ruled):
        a, b, c = [e for g in _groups(run, groups=2) for e in g][:3]
        # Written as the old code wrote them: no source, a gold item on a slot from 1000.
        rows[run.pk] = [Assignment.objects.create(run=run, experience=e, annotator=anna, slot=slot)
                        for e, slot in ((a, 0), (b, 0), (c, 1000))]
    migration.sources_fill(django_apps, None)
    sources = {run.pk: [Assignment.objects.get(pk=r.pk).source for r in rows[run.pk]] for run in (plain, ruled)}
    assert sources[plain.pk] == ["arrival", "arrival", "gold"]
    # Under a rule a row cannot tell its pick from the random share's: never counted unbiased.
    assert sources[ruled.pk] == ["unknown", "unknown", "gold"]
