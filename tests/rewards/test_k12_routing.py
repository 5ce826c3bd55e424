"""Reward routing by domain with K-12 in it: a K-12 task goes to the K-12 graders, a math task
still to math-verify, and an unknown domain is a config error naming it at every door
(form, API, CLI), before anything is written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client

from apps.buffer.importers import taskset_create
from apps.buffer.models import Task
from apps.rewards.k12_taskset import k12_records
from apps.rewards.scoring import default_routes, rewards_awaiting, rewards_inline
from kernel.config import ConfigInvalid, config_validate
from apps.runs.models import Run
from kernel.plugin_names import domains
from tests.factories import base_config, make_run

K12 = {"domain": "k12", "prompt": "What gas do plants take in to make food?", "reference": "carbon dioxide"}
MATH = {"domain": "math", "prompt": "Simplify 2/4.", "reference": "\\frac{1}{2}"}

SPEC: list[dict[str, Any]] = [
    {"name": "math_accuracy", "domains": ["math"]},
    {"name": "k12_judge", "weight": 0.25, "domains": ["k12"], "params": {"rubric": "Name the gas."}},
    {"name": "k12_learned", "weight": 0.75, "domains": ["k12"]},
]


def test_a_k12_task_goes_to_the_k12_judge_and_a_math_task_still_to_math_verify() -> None:
    # The default routes.
    assert rewards_awaiting(terms=[], task=K12) == ["k12_judge"]
    assert rewards_inline(terms=[], completion="carbon dioxide", task=K12).parts == {}
    assert rewards_awaiting(terms=[], task=MATH) == []
    # 0.5 equals 1/2 only to math-verify, not to a string comparison.
    assert rewards_inline(terms=[], completion="<answer>0.5</answer>", task=MATH).parts["math_accuracy"] == 1.0
    # A spec that names both K-12 graders with weights.
    terms = config_validate(data={"model": "m", "rewards": SPEC}).rewards
    assert rewards_awaiting(terms=terms, task=K12) == ["k12_judge", "k12_learned"]
    assert rewards_inline(terms=terms, completion="carbon dioxide", task=K12).parts == {}
    assert rewards_awaiting(terms=terms, task=MATH) == []
    assert rewards_inline(terms=terms, completion="<answer>0.5</answer>", task=MATH).parts == {"math_accuracy": 1.0}


def test_every_routed_domain_is_a_known_domain() -> None:
    assert set(default_routes()) <= set(domains()) and "k12" in domains()


def test_an_unknown_domain_is_a_config_error_naming_it() -> None:
    with pytest.raises(ConfigInvalid) as caught:
        config_validate(data={"model": "m", "rewards": [SPEC[0], {"name": "k12_judge", "domains": ["k-12"]}]})
    message = caught.value.errors["rewards.1.domains"]
    assert "unknown domain 'k-12'" in message and "k12" in message and "math" in message


@pytest.mark.parametrize(
    ("term", "field", "message"),
    [
        ({"name": "k12_judge", "params": {"engine": "magic"}}, "params.engine", "Engine must match the pattern"),
        ({"name": "k12_judge", "params": {"rubric": ""}}, "params.rubric", "at least 1 character"),
        ({"name": "k12_judge", "params": {"rubrik": "x"}}, "params.rubrik", "unknown param"),
        ({"name": "k12_learned", "params": {"epochs": 0}}, "params.epochs", "Epochs must be at least 1"),
        ({"name": "k12_learned", "params": {"heldout_share": 1.5}}, "params.heldout_share", "less than 1"),
    ],
)
def test_bad_k12_grader_params_fail_run_validation_naming_the_param(term: dict, field: str, message: str) -> None:
    with pytest.raises(ConfigInvalid) as caught:
        config_validate(data={"model": "m", "rewards": [term]})
    text = " ".join(caught.value.errors.values())
    assert field in text and message in text and term["name"] in text, caught.value.errors


@pytest.mark.django_db
def test_a_taskset_domain_no_term_scores_stops_run_creation(owner: User) -> None:
    taskset = taskset_create(name="k12", records=k12_records()[:3], owner=owner)
    with pytest.raises(ConfigInvalid) as caught:
        make_run(owner=owner, taskset=taskset, rewards=[SPEC[0]])
    assert "domain 'k12'" in caught.value.errors["rewards"]
    # With a K-12 term the same taskset makes a run.
    assert make_run(owner=owner, taskset=taskset, rewards=SPEC).cfg.rewards[2].name == "k12_learned"


# ---- the doors -----------------------------------------------------------------------


def _yaml(rewards: list[dict]) -> str:
    import yaml

    return yaml.safe_dump(rewards)


@pytest.mark.django_db
def test_the_form_shows_an_unknown_domain_beside_the_rewards_box(client: Client, owner: User) -> None:
    client.force_login(owner)
    data = {"name": "k12 run", "model": "local/demo", "algorithm": "grpo", "repeat_times": "4",
            "rewards": _yaml([{"name": "k12_judge", "domains": ["k13"]}])}
    response = client.post("/runs/new/", data)
    assert response.status_code == 400
    assert "unknown domain &#x27;k13&#x27;" in response.content.decode()
    assert not Run.objects.exists()
    # The same form with a known domain creates the run, its spec as typed.
    response = client.post("/runs/new/", {**data, "rewards": _yaml(SPEC)})
    assert response.status_code == 302
    run = Run.objects.get()
    assert [(t.name, t.weight) for t in run.cfg.rewards] == [
        ("math_accuracy", 1.0), ("k12_judge", 0.25), ("k12_learned", 0.75)]
    # The run page shows which grader scores which domain, with its weight.
    page = client.get(f"/runs/{run.pk}/").content.decode()
    routes = page[page.index('id="reward-routes"'):]
    k12 = routes[routes.index('data-domain="k12"'):routes.index("</tr>", routes.index('data-domain="k12"'))]
    assert "0.25 × <code>k12_judge</code>" in k12 and "0.75 × <code>k12_learned</code>" in k12
    assert "math_accuracy" not in k12
    math = routes[routes.index('data-domain="math"'):routes.index("</tr>", routes.index('data-domain="math"'))]
    assert "1.0 × <code>math_accuracy</code>" in math
    assert "No version yet" in routes  # the learned grader has not been trained


@pytest.mark.django_db
def test_the_cli_names_an_unknown_domain_and_creates_nothing(owner: User, tmp_path: Path) -> None:
    bad = tmp_path / "run.json"
    bad.write_text(json.dumps(base_config(rewards=[{"name": "k12_judge", "domains": ["science"]}])))
    with pytest.raises(CommandError, match=r"rewards\.0\.domains: unknown domain 'science'"):
        call_command("rft", "create", str(bad), "--name", "x", "--owner", "owner")
    # A taskset whose K-12 tasks no term scores is refused before it is imported.
    tasks = tmp_path / "k12.jsonl"
    tasks.write_text("".join(json.dumps(r) + "\n" for r in k12_records()))
    only_math = tmp_path / "math.json"
    only_math.write_text(json.dumps(base_config(rewards=[SPEC[0]])))
    with pytest.raises(CommandError, match="domain 'k12'"):
        call_command("rft", "create", str(only_math), "--name", "x", "--owner", "owner", "--taskset", str(tasks))
    assert not Run.objects.exists() and not Task.objects.exists()


@pytest.mark.django_db
def test_the_api_refuses_tasks_of_a_domain_the_run_does_not_score(owner: User) -> None:
    from tests.envapi.conftest import Api, make_key

    run = make_run(owner=owner, rewards=[SPEC[0], SPEC[1]])
    api = Api(make_key(run)[1])
    body = {"tasks": [{"prompt": "What is 2 + 2?", "reference": "4", "domain": "math"},
                      {"prompt": "Say hi.", "reference": "hi", "domain": "chat"}]}
    response = api.post(f"/runs/{run.pk}/tasks", body)
    assert response.status_code == 422, response.content
    assert "tasks.1.domain" in response.content.decode() and "'chat'" in response.content.decode()
    assert not Task.objects.exists()
    body["tasks"][1]["domain"] = "k12"
    assert api.post(f"/runs/{run.pk}/tasks", body).status_code == 200


@pytest.mark.django_db
def test_the_demo_command_makes_a_k12_run_on_the_shipped_taskset(settings: object, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    import os
    from io import StringIO

    from apps.rewards.k12_taskset import k12_taskset_write
    from apps.control.demo import DEMO_HELDOUT_FILE, DEMO_TASKSET_FILE

    # The demo model is rft_demo_model's business; a directory with its taskset stands in
    # for the cached build so this test stays fast (the slow tests use the real model).
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer.json"):  # laid out as a saved model
        (model_dir / name).write_text("{}")
    for name in (DEMO_TASKSET_FILE, DEMO_HELDOUT_FILE):
        (model_dir / name).write_text(json.dumps({"question": "1+1?", "answer": "2", "domain": "math"}) + "\n")
    settings.DEBUG, settings.RFT_DEMO_MODEL_DIR = True, model_dir  # type: ignore[attr-defined]
    import apps.cli.management.commands.rft_demo as demo

    monkeypatch.setattr(demo, "call_command", lambda *a, **k: None)  # rft_demo_model: built already
    out = StringIO()
    call_command("rft_demo", "--k12", "--password", "pw", stdout=out)
    call_command("rft_demo", "--k12", "--password", "pw", stdout=StringIO())  # idempotent
    run = Run.objects.get(name=demo.K12_RUN)
    assert f"run #{run.pk}" in out.getvalue()
    assert Run.objects.filter(name=demo.K12_RUN).count() == 1
    assert run.taskset is not None and run.taskset.tasks.filter(domain="k12").count() == len(k12_records())
    assert [t.name for t in run.cfg.rewards] == ["k12_judge", "k12_learned"]
    # The file form of the same taskset imports to the same tasks.
    path = k12_taskset_write(tmp_path / "k12.jsonl")
    assert [json.loads(line) for line in path.read_text().splitlines()] == k12_records()
    assert os.path.getsize(path) > 0


@pytest.mark.django_db
def test_k12_grader_versions_are_numbered_per_run_and_listed_by_the_api(owner: User) -> None:
    from apps.rewards.k12_rules import k12_grader_publish
    from apps.runs.models import Metric
    from tests.envapi.conftest import Api, make_key

    run, other = make_run(owner=owner, rewards=SPEC), make_run(owner=owner, name="other", rewards=SPEC)
    fields: dict[str, Any] = {"path": "/x", "base": "b", "pairs_train": 9, "pairs_heldout": 3, "grades": 12, "seconds": 1.0,
              "scale": 1.0, "offset": 0.5}
    v1 = k12_grader_publish(run=run, accuracy=0.7, **fields)
    v2 = k12_grader_publish(run=run, accuracy=0.8, **fields)
    assert (v1.version, v2.version, k12_grader_publish(run=other, accuracy=None, **fields).version) == (1, 2, 1)
    assert list(Metric.objects.filter(run=run, name="k12_grader/accuracy").values_list("step", "value")) == [
        (1, 0.7), (2, 0.8)]
    api = Api(make_key(run)[1])
    listed = api.get(f"/runs/{run.pk}/k12-graders").json()
    assert [(g["version"], g["accuracy"], g["grades"]) for g in listed] == [(2, 0.8, 12), (1, 0.7, 12)]
    assert api.get(f"/runs/{other.pk}/k12-graders").status_code == 404  # the key is not scoped to it: answered as a missing run (issue #33)


# ---- a misspelt domain with the default routes -----------------------------------------


def test_a_domain_that_misspells_a_routed_one_is_named_and_other_domains_are_their_own() -> None:
    from kernel.plugin_names import domain_misspelt

    assert [domain_misspelt(d) for d in ("K12", "k-12", " Math", "CODE", "Vision_", "General")] == [
        "k12", "k12", "math", "code", "vision", "general"]
    assert [domain_misspelt(d) for d in ("k12", "math", "chat", "trivia", "k13")] == [None] * 5


@pytest.mark.django_db
def test_tasks_of_a_misspelt_domain_are_refused_at_every_door_naming_the_record(
    client: Client, owner: User, tmp_path: Path
) -> None:
    """With the default routes a `K12` task would be scored by exact_match, not the K-12
    judge: the service, the CLI, the run form's upload and the environment API refuse it."""
    from apps.buffer.importers import ImportFailed
    from tests.envapi.conftest import Api, make_key

    bad = {**K12, "domain": "K12"}
    with pytest.raises(ImportFailed) as caught:
        taskset_create(name="k12", records=[K12, bad], owner=owner)
    assert caught.value.field == "record 2"
    assert "domain 'K12' is not a reward domain; did you mean 'k12'?" in str(caught.value)

    tasks = tmp_path / "k12.jsonl"
    tasks.write_text(json.dumps(K12) + "\n" + json.dumps(bad) + "\n")
    config = tmp_path / "run.json"
    config.write_text(json.dumps(base_config()))
    with pytest.raises(CommandError, match=r"line 2: domain 'K12' is not a reward domain; did you mean 'k12'"):
        call_command("rft", "create", str(config), "--name", "x", "--owner", "owner", "--taskset", str(tasks))

    client.force_login(owner)
    with tasks.open("rb") as fh:
        response = client.post("/runs/new/", {"name": "k12 run", "model": "local/demo", "algorithm": "grpo",
                                              "repeat_times": "4", "taskset": fh})
    assert response.status_code == 400
    assert "did you mean &#x27;k12&#x27;" in response.content.decode()
    assert not Run.objects.exists() and not Task.objects.exists()

    run = make_run(owner=owner)
    api = Api(make_key(run)[1])
    response = api.post(f"/runs/{run.pk}/tasks", {"tasks": [K12, bad]})
    assert response.status_code == 422, response.content
    assert "tasks.1" in response.content.decode() and "did you mean 'k12'" in response.content.decode()
    assert not Task.objects.exists()
    # A domain of its own is still "anything else": exact_match.
    assert api.post(f"/runs/{run.pk}/tasks", {"tasks": [{**K12, "domain": "chat"}]}).status_code == 200


@pytest.mark.django_db
def test_a_run_on_tasks_of_a_misspelt_domain_imported_earlier_does_not_start(owner: User) -> None:
    from apps.runs.services import RunCannotStart, run_transition

    taskset = taskset_create(name="k12", records=[K12], owner=owner)
    run = make_run(owner=owner, taskset=taskset, rewards=[])  # the default routes
    Task.objects.filter(taskset=taskset).update(domain="K12")  # data from before the importers refused it
    with pytest.raises(RunCannotStart) as caught:
        run_transition(run=run, action="start", actor=owner)
    assert "did you mean 'k12'" in caught.value.errors["taskset"]
    # An explicit spec says what scores which domain: a term without domains scores any.
    Run.objects.filter(pk=run.pk).update(config={**run.config, "rewards": [{"name": "exact_match"}]})
    run.refresh_from_db()
    assert run_transition(run=run, action="start", actor=owner).status == Run.Status.RUNNING
