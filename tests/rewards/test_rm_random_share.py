"""The reward model's accuracy on the random share alone: the unbiased estimate beside its
held-out accuracy, on the reward-model panel and over the API.

The selection rule hands out the pairs that straddle the model's decision, and those are where
people's labels look least like the rest. Crafted here: on the groups the rule goes to first
(the previous version scores them one right, one wrong) Anna prefers the bare answer, on every
other group the tagged one. The likelihood reward model, trained and cross-validated on all her
pairs, learns the majority; its accuracy over every pair is pulled down by the rule's pairs,
while on the pairs the random share handed out it is what a fresh item would see.

Personas: Olga owns the run; Anna annotates at the annotation page."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.test import Client

torch = pytest.importorskip("torch")

from apps.buffer.models import Experience
from apps.buffer.services import experience_write
from apps.envapi.services import api_key_create
from apps.feedback.models import Assignment
from apps.rewards.models import RewardModel, RewardModelScore
from apps.runs.models import Run
from tests.factories import add_member, experience_row, make_run, make_user
from workers.reward.trainer import reward_model_train_run
from apps.runs.ports import run_view_of


pytestmark = [pytest.mark.django_db, pytest.mark.slow]

STRADDLING = 8  # groups the rule hands out first
GROUPS = 80
VISITS = 8  # page visits of 8 items: 32 pairs, a quarter the rule's (random_share 0.75)


@pytest.fixture(autouse=True)
def _storage(settings: object, tmp_path: Path) -> None:
    settings.RFT_STORAGE_DIR = tmp_path / "storage"  # type: ignore[attr-defined]
    torch.set_num_threads(1)


def _run(olga: User, anna: User, model: Path, **rm: object) -> tuple[Run, set[str]]:
    """The run, and the groups the rule goes to first (where Anna prefers the bare answer)."""
    run = make_run(owner=olga, seed=3, feedback={
        "mode": "blend", "overlap": 1, "selection": {"uncertainty": 1.0, "random_share": 0.75, "pairs": True}},
        reward_model={"enabled": True, "kind": "likelihood", "base": str(model), "max_length": 64, "crossval_folds": 4,
                      **rm})
    add_member(run, anna)
    rng = random.Random(0)
    rows = []
    for g in range(GROUPS):
        a, b = rng.randint(0, 99), rng.randint(0, 9)
        for i, text in enumerate((f"<answer>{a + b}</answer>", f"{a + b} is it")):
            rows.append(experience_row(run, key=f"g{g}-{i}", group=f"g{g}", status="pending", reward=None,
                                       auto_reward=0.0, prompt_text=f"What is {a} + {b}?", response_text=text))
    exps = list(Experience.objects.filter(pk__in=experience_write(experiences=rows).ids).order_by("id"))
    # A previous version: one right, one wrong on the first groups (the pairs straddling its
    # decision, the rule's first picks); sure both are wrong on the rest.
    previous = RewardModel.objects.create(run=run, version=1, path="/nowhere", base="x", accuracy=0.9)
    RewardModelScore.objects.bulk_create([
        RewardModelScore(experience=e, reward_model=previous,
                         score=(0.5 if k % 2 == 0 else -0.5) if k < 2 * STRADDLING else -0.5)
        for k, e in enumerate(exps)])
    return run, {f"g{g}" for g in range(STRADDLING)}


def _annotate(run: Run, anna: User, straddling: set[str]) -> None:
    """Anna opens the page and rates her queue, VISITS times: 5 for the answer she prefers."""
    client = Client()
    client.force_login(anna)
    for _ in range(VISITS):
        assert client.get(f"/runs/{run.pk}/annotate/").status_code == 200
        for a in Assignment.objects.filter(run=run, annotator=anna, status="leased").select_related("experience"):
            tagged = a.experience.response_text.startswith("<answer>")
            prefers = not tagged if a.experience.group_id in straddling else tagged
            r = client.post(f"/runs/{run.pk}/annotate/items/{a.pk}/rate/", {"score": "5" if prefers else "1"},
                            HTTP_HX_REQUEST="true")
            assert r.status_code == 200


def test_a_held_out_split_measures_the_random_share_on_its_held_out_pairs_only(
    owner: User, demo_model_dir: Path,
) -> None:
    anna = make_user("anna")
    run, straddling = _run(owner, anna, demo_model_dir, crossval_folds=0, heldout_share=0.5)
    _annotate(run, anna, straddling)
    rm = reward_model_train_run(run=run_view_of(run), force=True)
    assert rm is not None and rm.accuracy is not None and rm.accuracy_random is not None
    # Of the held-out pairs only those of the random share count, and the rule's are among the rest.
    assert 0 < rm.pairs_random < rm.pairs_heldout  # type: ignore[operator]
    assert rm.accuracy_random > rm.accuracy


def test_the_panel_and_the_api_show_the_accuracy_on_the_random_share_beside_the_biased_one(
    owner: User, demo_model_dir: Path,
) -> None:
    olga, anna = owner, make_user("anna")
    run, straddling = _run(olga, anna, demo_model_dir)
    _annotate(run, anna, straddling)
    assert reward_model_train_run(run=run_view_of(run), force=True) is not None

    _, raw = api_key_create(name="env", runs=[run], actions=["read"], rate_limit_per_minute=1000)
    newest = Client().get(f"/api/v1/runs/{run.pk}/reward-models",
                          headers={"Authorization": f"Bearer {raw}"}).json()[0]
    # 32 pairs, each cross-validated; 24 of them the random share's (3 of every 4 hand-outs).
    assert newest["version"] == 2 and newest["pairs_heldout"] == 32
    assert newest["pairs_random"] == 24
    # Over every pair the rule's "mislabelled-looking" pairs pull the accuracy down; on the
    # random share's pairs it is what the model does on the items it did not choose.
    # (24 pairs: one is 0.04. The demo model's build moves these by a pair or two: 0.875 on
    # one build, 0.9 or more on another.)
    assert newest["accuracy"] <= 0.85
    assert newest["accuracy_random"] >= 0.8
    assert newest["accuracy_random"] - newest["accuracy"] >= 0.1

    client = Client()
    client.force_login(olga)
    panel = client.get(f"/runs/{run.pk}/signal/reward-model/", HTTP_HX_REQUEST="true").content.decode()
    shown = re.search(r'data-figure="rm-accuracy-random">([^<]+)</b>\s*<span[^>]*>\((\d+) pairs\)', panel)
    assert shown is not None, panel
    assert shown.group(1) == f"{newest['accuracy_random']:.3f}" and shown.group(2) == "24"
    assert re.search(r'data-figure="rm-accuracy">' + re.escape(f"{newest['accuracy']:.3f}"), panel)
    # Both are charted on the run page, per version (the metrics feed its charts read).
    series = client.get(f"/runs/{run.pk}/metrics/").json()["series"]
    assert [p[:2] for p in series["reward_model/accuracy"]][-1] == [2, newest["accuracy"]]
    assert [p[:2] for p in series["reward_model/accuracy_random"]][-1] == [2, newest["accuracy_random"]]


def test_with_no_pair_from_the_random_share_the_panel_shows_a_dash(owner: User) -> None:
    run = make_run(owner=owner, reward_model={"enabled": True})
    RewardModel.objects.create(run=run, version=1, path="/nowhere", base="x", accuracy=0.8, pairs_heldout=10,
                               accuracy_random=None, pairs_random=0)
    client = Client()
    client.force_login(owner)
    panel = client.get(f"/runs/{run.pk}/signal/reward-model/", HTTP_HX_REQUEST="true").content.decode()
    assert re.search(r'data-figure="rm-accuracy-random">—</b>\s*<span[^>]*>\(0 pairs\)', panel)
