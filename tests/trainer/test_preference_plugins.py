"""A feedback kind that states preferences and an algorithm that trains on preference pairs are
one plugin file each, and nothing else is edited to use them.

The persona: a lab whose raters pick the best answer of a group (tests/trainer/plugin_best_of.py:
the pick is preferred over every other member) and who train with SLiC's hinge on pairs
(tests/trainer/plugin_slic.py). Loaded as RFT_PLUGINS loads them at a process's start, the
raters' pair agreement counts the picks, the reward model's pairs and the DPO export's human
choices hold them, the preference export writes them, the Python client reads the kind from
the API schema and posts one, and the algorithm's train step gets them in its batch, because
each of those reads a declaration (the kind's `agreement` and `reaches`, the algorithm's
`preference_pairs`), never a name."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest
from django.contrib.auth.models import User
from django.test import Client

from apps.buffer.models import Experience
from apps.buffer.services import experience_write
from apps.envapi.services import api_key_create
from apps.feedback.training_data import export_rows
from apps.feedback.kinds import kind_unregister
from apps.feedback.models import Feedback
from apps.feedback.reward_model.preferences import preference_pairs
from apps.feedback.raters.reliability import rater_figures, run_agreement
from apps.feedback.selectors import dpo_pairs, preferences_among
from apps.runs.models import Run
from kernel import plugins
from kernel.algorithms import algorithm_unregister
from kernel.plugins import plugins_load
from rftweb.client import RftClient
from tests.factories import add_member, experience_row, make_run, make_user

pytestmark = pytest.mark.django_db

KIND = "tests.trainer.plugin_best_of"
ALGORITHM = "tests.trainer.plugin_slic"


@pytest.fixture
def best_of(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """Both plugin modules loaded as a process loads RFT_PLUGINS at its start; taken out after
    (another test sees the built-in kinds and algorithms only). The kind's module is yielded."""
    monkeypatch.setattr(plugins, "LOADED", [])
    plugins_load([KIND, ALGORITHM])
    yield sys.modules[KIND]
    kind_unregister("best_of")
    algorithm_unregister("slic")
    for module in (KIND, ALGORITHM):
        sys.modules.pop(module, None)


def _group(run: Run, tag: str, rewards: list[float]) -> list[Experience]:
    rows = [experience_row(run, key=f"{tag}-{i}", group=tag, reward=r, response_text=f"answer {tag}.{i}")
            for i, r in enumerate(rewards)]
    ids = experience_write(experiences=rows).ids
    return list(Experience.objects.filter(pk__in=ids).order_by("id"))


class _DjangoTransport(httpx.BaseTransport):
    """The client's requests answered by this process's Django (the test's database
    transaction included), as a server would answer them."""

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = Client().generic(request.method, request.url.raw_path.decode(), data=request.read(),
                                    content_type=request.headers.get("content-type", ""),
                                    headers={"Authorization": request.headers["authorization"]})
        return httpx.Response(response.status_code, headers=dict(response.items()), content=response.content)


def test_a_preference_kind_reaches_agreement_pairs_exports_and_the_client(best_of: ModuleType, owner: User) -> None:
    run = make_run(owner=owner, algorithm="slic", repeat_times=3, feedback={"rater_weighting": "agreement"})
    worst, middle, best = _group(run, "g", [0.0, 0.5, 1.0])
    raters = {name: make_user(name) for name in ("ann", "ben", "cat")}
    for person in raters.values():
        add_member(run, person)
    # Ann and Ben pick the worst-rewarded answer as best, Cat the middle one.
    for name, pick in (("ann", worst), ("ben", worst), ("cat", middle)):
        best_of.feedback_best_of(run=run, experience=pick, author=raters[name])

    # The raters' pair agreement counts the picks (the kind's `agreement`): on (worst, middle)
    # three raters, Ann and Ben agree and Cat with neither; on (worst, best) Ann and Ben agree.
    agreement = run_agreement(run=run)
    assert (agreement["pairwise_agreement"], agreement["pairwise_rater_pairs"]) == (0.5, 4)
    figures = {f.username: (f.agreement, f.agreement_items) for f in rater_figures(run=run)}
    assert figures == {"ann": (0.5, 2), "ben": (0.5, 2), "cat": (-1.0, 1)}

    # The reward model's pairs, the DPO choices and a preference algorithm's batch hold them.
    stated = [(worst, middle), (worst, best), (worst, middle), (worst, best), (middle, worst), (middle, best)]
    ids = [(a.pk, b.pk) for a, b in stated]
    assert sorted((p.kind, p.chosen_id, p.rejected_id) for p in preference_pairs(run=run)) == sorted(
        ("best_of", a, b) for a, b in ids)
    assert [(p.chosen_id, p.rejected_id) for p in dpo_pairs(run=run)] == ids
    assert preferences_among(run=run, ids=[worst.pk, middle.pk, best.pk]) == ids
    assert preferences_among(run=run, ids=[worst.pk, best.pk]) == [(worst.pk, best.pk)] * 2

    # The DPO export: the group's best over its worst by reward, then each pair people stated once.
    dpo = [(r["chosen"][0]["content"], r["rejected"][0]["content"]) for r in export_rows(run=run, export_format="dpo")]
    text = {e.pk: e.response_text for e in (worst, middle, best)}
    assert dpo == [(text[best.pk], text[worst.pk])] + [(text[a], text[b]) for a, b in dict.fromkeys(ids)]
    preferences = [(r["chosen"][0]["content"], r["rejected"][0]["content"])
                   for r in export_rows(run=run, export_format="preferences")]
    assert sorted(preferences) == sorted((text[a], text[b]) for a, b in ids)

    # The client: the kind is in the API schema's feedback bodies, and posting one stores it.
    _, key = api_key_create(name="env", runs=[run], actions=["read", "feedback"], rate_limit_per_minute=10_000)
    with RftClient("http://testserver", key, retries=0, transport=_DjangoTransport()) as client:
        assert client.feedback_kinds() == ["env_reward", "rating", "pairwise", "ranking", "flag", "best_of"]
        result = client.feedback(run.pk, kind="best_of", experience_id=best.pk)
    stored = Feedback.objects.get(pk=result["id"])
    assert (stored.kind, stored.experience_id, stored.value) == ("best_of", best.pk, {"over": [worst.pk, middle.pk]})


@pytest.fixture
def _storage(settings: Any, tmp_path: Path) -> Iterator[None]:
    from workers.trainer import resident as trainer_resident

    settings.RFT_STORAGE_DIR = tmp_path / "storage"
    trainer_resident.RESIDENTS.clear()
    yield
    trainer_resident.RESIDENTS.clear()


@pytest.mark.slow
def test_a_preference_algorithm_trains_on_the_pairs_a_preference_kind_states(
    best_of: ModuleType, owner: User, tiny_model_dir: Path, _storage: None
) -> None:
    from tests.trainer.conftest import running_run
    from workers.trainer.journal import journal_path, journal_read
    from workers.trainer.step import trainer_step

    run = running_run(owner, tiny_model_dir, algorithm="slic", train_batch_size=4, repeat_times=2,
                      trainer={"learning_rate": 1e-3})
    groups = [_group(run, f"g{g}", [1.0, 0.0]) for g in range(4)]  # two for the step, two to go on
    # Against its rewards: the rater picks each group's lower-rewarded answer.
    for high, low in groups:
        best_of.feedback_best_of(run=run, experience=low, author=owner)
    assert trainer_step(run_id=run.pk, step=1)["status"] == "trained"
    batch, _ = journal_read(journal_path(run.pk, 1))
    trained = {r.group_id for r in batch.usual}
    assert len(trained) == 2
    assert sorted(batch.preferences) == sorted((low.pk, high.pk) for high, low in groups if high.group_id in trained)
