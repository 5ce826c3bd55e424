"""The selection rule of the annotation queue: most uncertain first, the random share kept,
no item beyond its overlap, and gold items mixed in unannounced."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from apps.buffer.models import Experience
from apps.buffer.services import experience_write
from apps.feedback.models import Assignment
from apps.feedback.handout.rule import candidate_priorities, share_slots
from apps.feedback.handout.lease import assignment_claim
from apps.rewards.models import GoldItem, RewardModel, RewardModelScore
from apps.runs.models import Run
from tests.factories import add_member, claims_at_once, experience_row, make_run, make_user

pytestmark = pytest.mark.django_db


def _selected_run(owner: User, **selection: float | bool) -> Run:
    return make_run(owner=owner, feedback={"mode": "blend", "overlap": 1, "selection": selection},
                    reward_model={"enabled": True})


def _scored_groups(run: Run, scores: list[list[float]], *, autos: list[list[float]] | None = None,
                   version: int = 1) -> list[list[Experience]]:
    """Groups whose members the reward model `version` scored as given."""
    rm, _ = RewardModel.objects.get_or_create(run=run, version=version, defaults={"path": "/nowhere", "base": "x",
                                                                                 "accuracy": 0.9})
    rows = []
    for g, group in enumerate(scores):
        for i, _ in enumerate(group):
            auto = autos[g][i] if autos else 0.5
            rows.append(experience_row(run, key=f"g{g}-{i}", group=f"g{g}", status="pending", reward=None,
                                       auto_reward=auto, response_text=f"answer {g}.{i}"))
    ids = experience_write(experiences=rows).ids
    exps = list(Experience.objects.filter(pk__in=ids).order_by("id"))
    out, k = [], 0
    for group in scores:
        members = exps[k:k + len(group)]
        k += len(group)
        RewardModelScore.objects.bulk_create([RewardModelScore(experience=e, reward_model=rm, score=s)
                                              for e, s in zip(members, group, strict=True)])
        out.append(members)
    return out


def test_the_share_is_exact_over_every_prefix_of_hand_outs() -> None:
    for share in (0.1, 0.25, 1 / 3):
        flags = share_slots(start=0, count=300, share=share)
        for n in (1, 7, 10, 99, 300):
            assert sum(flags[:n]) == int(n * share + 1e-9)
        # Counting on from where the last claim stopped continues the same sequence.
        assert share_slots(start=37, count=50, share=share) == flags[37:87]


def test_the_most_uncertain_group_is_handed_out_first(owner: User, annotator: User) -> None:
    run = _selected_run(owner, uncertainty=1.0)
    sure, unsure, middling = _scored_groups(run, [[0.0, 5.0], [0.0, 0.01], [0.0, 1.0]])
    first = assignment_claim(run=run, annotator=annotator, size=2)
    assert [a.experience_id for a in first] == [e.pk for e in unsure]
    Assignment.objects.filter(pk__in=[a.pk for a in first]).update(status="done")
    second = assignment_claim(run=run, annotator=annotator, size=4)
    assert [a.experience_id for a in second] == [e.pk for e in middling + sure]


@pytest.mark.parametrize("pairs", [True, False])
def test_the_group_the_reward_models_heads_disagree_on_is_handed_out_first(
    owner: User, annotator: User, pairs: bool,
) -> None:
    """Two groups the version scores alike; its ensemble of heads (the `head` kind) agrees on
    one and splits on the other: a label teaches most there, so it goes first, whichever of
    the two is fresher."""
    for split_is_older in (False, True):
        run = _selected_run(owner, uncertainty=1.0, pairs=pairs)
        older, newer = _scored_groups(run, [[0.0, 0.0], [0.0, 0.0]])
        split, agreed = (older, newer) if split_is_older else (newer, older)
        RewardModelScore.objects.filter(experience__in=agreed).update(spread=0.01)
        RewardModelScore.objects.filter(experience__in=split).update(spread=0.8)
        first = assignment_claim(run=run, annotator=annotator, size=2)
        assert {a.experience_id for a in first} == {e.pk for e in split}, split_is_older


def test_disagreement_and_variance_rank_by_their_own_source(owner: User) -> None:
    run = _selected_run(owner, disagreement=1.0)
    # Calibration of the fake version: scale 1, offset 0.5 (defaults), so score 0.5 -> 1.0.
    agree, clash = _scored_groups(run, [[0.0, 0.0], [0.5, 0.5]], autos=[[0.5, 0.5], [0.0, 0.0]])
    ranked = [p.experience_id for p in candidate_priorities(run=run, candidates=agree + clash)]
    assert ranked[:2] == [e.pk for e in clash]

    run2 = _selected_run(owner, variance=1.0)
    flat, spread = _scored_groups(run2, [[0.0, 0.0], [0.0, 0.0]], autos=[[0.5, 0.5], [0.0, 1.0]])
    ranked = [p.experience_id for p in candidate_priorities(run=run2, candidates=flat + spread)]
    assert ranked[:2] == [e.pk for e in spread]


def test_the_random_share_is_kept_and_the_rule_still_gets_its_top_items(owner: User) -> None:
    run = _selected_run(owner, uncertainty=1.0, random_share=0.25, pairs=False)
    # 100 groups of two; group g's margin is g: group 0 is the most uncertain.
    groups = _scored_groups(run, [[0.0, float(g) + 0.5] for g in range(100)])
    ranked = [p.experience_id for p in candidate_priorities(run=run, candidates=[e for g in groups for e in g])]
    annotators = [make_user(f"ann{i}") for i in range(4)]
    handed = [a.experience_id for u in annotators for a in assignment_claim(run=run, annotator=u, size=5)]
    assert len(handed) == len(set(handed)) == 20
    # 15 of the 20 hand-outs follow the rule: the 15 most uncertain items are all out ...
    assert set(ranked[:15]) <= set(handed)
    # ... and the 5 random picks came from anywhere: some fall outside the top 20.
    assert set(handed) - set(ranked[:20])


def test_without_overlap_two_annotators_never_share_an_item(transactional_db: None, owner: User) -> None:
    run = _selected_run(owner, uncertainty=1.0, random_share=0.5)
    _scored_groups(run, [[0.0, float(g)] for g in range(12)])
    claims_at_once(run, [make_user(f"racer{i}") for i in range(4)], size=8)
    live = list(Assignment.objects.filter(run=run).values_list("experience_id", flat=True))
    assert len(live) == len(set(live)) == 24  # every item handed out once, none twice


def test_gold_items_are_mixed_in_at_the_rate_and_never_announced(owner: User, annotator: User) -> None:
    run = make_run(owner=owner, feedback={"mode": "blend", "overlap": 1, "gold_rate": 0.25})
    add_member(run, annotator)
    rows = [experience_row(run, key=f"k{i}", group=f"g{i // 2}", status="pending", reward=None, auto_reward=0.5,
                           response_text=f"answer {i}") for i in range(20)]
    exps = list(Experience.objects.filter(pk__in=experience_write(experiences=rows).ids).order_by("id"))
    gold = exps[-4:]
    for e in gold:
        GoldItem.objects.create(run=run, experience=e, answer=1.0, created_by=owner)
    client = Client()
    client.force_login(annotator)
    page = client.get(f"/runs/{run.pk}/annotate/")
    assert page.status_code == 200
    mine = list(Assignment.objects.filter(run=run, annotator=annotator).order_by("id"))
    assert len(mine) == 8
    assert sum(a.experience_id in {g.pk for g in gold} for a in mine) == 2
    html = page.content.decode()
    assert "gold" not in html.lower()
    # A gold item is handed to every annotator (its slots are beside the overlap's).
    other = make_user("second")
    add_member(run, other)
    theirs = assignment_claim(run=run, annotator=other, size=8)
    assert sum(a.experience_id in {g.pk for g in gold} for a in theirs) == 2
    # Rating a gold item answers as any item does.
    item = next(a for a in mine if a.experience_id in {g.pk for g in gold})
    plain = next(a for a in mine if a.experience_id not in {g.pk for g in gold})
    r_gold = client.post(f"/runs/{run.pk}/annotate/items/{item.pk}/rate/", {"score": "4"}, HTTP_HX_REQUEST="true")
    r_plain = client.post(f"/runs/{run.pk}/annotate/items/{plain.pk}/rate/", {"score": "4"}, HTTP_HX_REQUEST="true")
    assert r_gold.status_code == r_plain.status_code == 200
    assert "gold" not in r_gold.content.decode().lower()
    assert r_gold.content.decode().replace(str(item.pk), "X").replace(str(item.experience_id), "Y").count("<") == \
        r_plain.content.decode().replace(str(plain.pk), "X").replace(str(plain.experience_id), "Y").count("<")


def test_a_trained_on_gold_item_reads_as_any_fresh_item(owner: User, annotator: User, monkeypatch: pytest.MonkeyPatch,
                                                       django_capture_on_commit_callbacks: Any) -> None:
    """Gold items are usually old, consumed completions: nothing on the card, the answer to
    a rating, the live event or "your submissions" may say so."""
    from apps.feedback.kinds import submit
    from apps.feedback.review.revise import my_submissions

    run = make_run(owner=owner, feedback={"mode": "blend", "overlap": 1, "gold_rate": 0.5})
    add_member(run, annotator)
    old = [experience_row(run, key=f"old{i}", group="g-old", status="ready", reward=0.5, auto_reward=0.5,
                          response_text=f"old answer {i}") for i in range(2)]
    fresh = [experience_row(run, key=f"new{i}", group=f"g-new{i}", status="pending", reward=None, auto_reward=0.5,
                            response_text=f"new answer {i}") for i in range(4)]
    experience_write(experiences=old + fresh)
    Experience.objects.filter(run=run, group_id="g-old").update(status="consumed")  # the trainer took it
    gold_exp = Experience.objects.get(run=run, response_text="old answer 0")
    GoldItem.objects.create(run=run, experience=gold_exp, answer=1.0, created_by=owner)
    client = Client()
    client.force_login(annotator)
    events: list[dict[str, Any]] = []
    monkeypatch.setattr(submit, "event_publish", lambda **kw: events.append(kw))

    page = client.get(f"/runs/{run.pk}/annotate/").content.decode()
    mine = {a.experience_id: a for a in Assignment.objects.filter(run=run, annotator=annotator)}
    assert gold_exp.pk in mine
    card = page[page.index(f'data-experience="{gold_exp.pk}"'):]
    card = card[:card.index("</article>")].lower()
    assert "consumed" not in card and "trained" not in card and "gold" not in card
    plain_pk = next(pk for pk in mine if pk != gold_exp.pk)
    with django_capture_on_commit_callbacks(execute=True):
        done = client.post(f"/runs/{run.pk}/annotate/items/{mine[gold_exp.pk].pk}/rate/", {"score": "5"},
                           HTTP_HX_REQUEST="true").content.decode().lower()
        client.post(f"/runs/{run.pk}/annotate/items/{mine[plain_pk].pk}/rate/", {"score": "5"}, HTTP_HX_REQUEST="true")
    assert "late" not in done and "consumed" not in done
    saved = [e["payload"] for e in events if e["type"] == "feedback.saved"]
    assert [p["late"] for p in saved] == [False, False]
    # Both submissions may be revised alike; the trained gold item's reward did not move.
    subs = my_submissions(run=run, author=annotator)
    assert [m["revisable"] for m in subs] == [True, True]
    gold_exp.refresh_from_db()
    assert (gold_exp.status, gold_exp.reward, gold_exp.human_reward) == ("consumed", 0.5, None)
    undo = client.post(f"/runs/{run.pk}/annotate/mine/", {"feedback": str(subs[1]["feedback"].pk)},
                       HTTP_HX_REQUEST="true")
    assert undo.status_code == 200 and "trained on" not in undo.content.decode()


# ---------------------------------------------------------------- sibling pairs


def _rated_groups(run: Run, *, groups: int, size: int, right_score: float = 0.45,
                  wrong_score: float = -0.4) -> list[list[Experience]]:
    """Groups of `size` completions of one prompt each: member 0 right, the rest wrong. The
    reward model scores the right one high and the wrong ones low and nearly alike (their
    margins the smallest: what plain per-item uncertainty hands out first)."""
    scores = [[right_score] + [wrong_score + 0.001 * i for i in range(1, size)] for _ in range(groups)]
    out = _scored_groups(run, scores)
    for members in out:
        Experience.objects.filter(pk=members[0].pk).update(response_text="<answer>right</answer>")
        Experience.objects.filter(pk__in=[m.pk for m in members[1:]]).update(response_text="<answer>wrong</answer>")
    return out


def _rate_on_the_page(run: Run, user: User, *, budget: int) -> int:
    """An annotator at the annotation page: rates the first `budget` items of the queue (5
    when the answer is right, 1 when wrong), skips the rest, as bench/steering's rater does."""
    client = Client()
    client.force_login(user)
    assert client.get(f"/runs/{run.pk}/annotate/").status_code == 200
    done = 0
    for a in Assignment.objects.filter(run=run, annotator=user, status="leased").select_related("experience") \
            .order_by("id"):
        if done < budget:
            score = "5" if "right" in a.experience.response_text else "1"
            r = client.post(f"/runs/{run.pk}/annotate/items/{a.pk}/rate/", {"score": score}, HTTP_HX_REQUEST="true")
            assert r.status_code == 200
            done += 1
        else:
            client.post(f"/runs/{run.pk}/annotate/items/{a.pk}/skip/", {}, HTTP_HX_REQUEST="true")
    return done


def _pairs_of(assignments: list[Assignment]) -> list[tuple[Experience, Experience]]:
    items = [a.experience for a in assignments]
    return list(zip(items[0::2], items[1::2], strict=True))


def test_labels_go_out_as_sibling_pairs_each_pair_to_one_annotator(owner: User) -> None:
    run = _selected_run(owner, uncertainty=1.0, random_share=0.25)
    _rated_groups(run, groups=30, size=8)
    raters = [make_user(f"pairer{i}") for i in range(3)]
    for rater in raters:
        add_member(run, rater)
    for _ in range(2):  # two rounds: each annotator's second claim continues the run-wide share
        for rater in raters:
            _rate_on_the_page(run, rater, budget=8)  # every item rated: a skipped one goes back to the queue
    handed: list[int] = []
    for rater in raters:
        mine = list(Assignment.objects.filter(run=run, annotator=rater).select_related("experience").order_by("id"))
        assert len(mine) == 16, [(a.experience.group_id, a.status) for a in mine]
        # Every consecutive two of an annotator's hand-outs are siblings: the 16 items are 8 pairs.
        assert all(a.group_id == b.group_id and a.pk != b.pk for a, b in _pairs_of(mine))
        handed += [a.experience_id for a in mine]
    assert len(handed) == len(set(handed))  # no item to two annotators (overlap 1)


def test_the_random_share_counts_pairs_and_random_pairs_are_siblings_too(owner: User) -> None:
    from apps.feedback.handout.rule import selection_order

    run = _selected_run(owner, uncertainty=1.0, random_share=0.25)
    groups = _rated_groups(run, groups=40, size=4)
    candidates = [e for g in groups for e in g]
    group_of = {e.pk: e.group_id for e in candidates}
    order = selection_order(run=run, candidates=candidates, want=40, handed_out=0)
    first = order[:20]  # 40 items, 20 pairs: the share is counted over pairs
    assert [source for _, source in first].count("random") == 5
    assert all(len(unit) == 2 and group_of[unit[0]] == group_of[unit[1]] for unit, _ in first)
    # The rule's pairs straddle the model's decision: its right answer beside a wrong one.
    rule = [unit for unit, source in first if source == "rule"]
    right = {g[0].pk for g in groups}
    assert sum(len(set(unit) & right) == 1 for unit in rule) >= len(rule) // 2
    # Random pairs come from anywhere: not only the groups the rule reached first.
    rule_groups = {group_of[u[0]] for u in rule}
    assert any(group_of[unit[0]] not in rule_groups for unit, source in first if source == "random")


def test_pairs_make_more_reward_model_pairs_from_the_same_ratings(owner: User) -> None:
    """The same six ratings through the annotation page: picked one by one by the reward
    model's smallest margins they are six wrong answers of one prompt, rated alike (no pair);
    picked as pairs straddling its decision they put each right answer beside a wrong one."""
    from apps.feedback.reward_model.preferences import preference_pairs

    derived = {}
    for pairs in (False, True):
        run = _selected_run(owner, uncertainty=1.0, pairs=pairs)
        _rated_groups(run, groups=6, size=8)
        rater = make_user(f"rater-{pairs}")
        add_member(run, rater)
        assert _rate_on_the_page(run, rater, budget=6) == 6
        derived[pairs] = preference_pairs(run=run)
    assert len(derived[False]) == 0
    assert len(derived[True]) >= 3
    assert all("right" in p.chosen and "wrong" in p.rejected for p in derived[True])


def test_with_no_reward_model_a_pair_is_two_random_siblings(owner: User, annotator: User) -> None:
    run = _selected_run(owner, variance=1.0)
    add_member(run, annotator)
    rows = [experience_row(run, key=f"k{i}", group=f"g{i // 8}", status="pending", reward=None,
                           auto_reward=float(i % 2), response_text=f"answer {i}") for i in range(32)]
    experience_write(experiences=rows)
    picks = set()
    for seed in range(6):  # the hand-out is seeded by the run's seed: the same claim repeats under one
        Assignment.objects.filter(run=run).delete()
        run.config = {**run.config, "seed": seed}
        run.save(update_fields=["config"])
        mine = assignment_claim(run=run, annotator=annotator, size=2)
        assert len(mine) == 2 and mine[0].experience.group_id == mine[1].experience.group_id
        picks.add(frozenset(a.experience_id for a in mine))
    assert len(picks) > 1  # not always the first two members
