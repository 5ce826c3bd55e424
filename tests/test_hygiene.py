"""Input hygiene at every door (issue 20): what Postgres cannot hold, what a parser would
blow up on, and booleans posing as numbers are refused with the field or line named, as a
4xx on the web, a message and a non-zero exit in the CLI, and nothing is written."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client

from apps.buffer.importers import ImportFailed, taskset_import
from apps.buffer.models import Experience, Task, Taskset
from kernel.input_checks import InputRejected, json_parse, yaml_parse
from kernel.config import ConfigInvalid, config_parse
from apps.runs.models import Run
from tests.envapi.conftest import Api, make_key
from tests.factories import make_run
from tests.servers import ROOT, child_env

pytestmark = pytest.mark.django_db

GOOD = "model: local/demo\nalgorithm: grpo\nrepeat_times: 4\nrewards:\n  - name: exact_match\n"

# Run configs the issue found crashing the database write, with the field each must name.
BAD_CONFIGS: list[tuple[str, str, str]] = [
    ("nan-weight.yaml", GOOD.replace("exact_match\n", "exact_match\n    weight: .nan\n"), "rewards.0.weight"),
    ("inf-w_auto.yaml", GOOD + "feedback: {w_auto: .inf}\n", "feedback.w_auto"),
    ("inf-wait.yaml", GOOD + "feedback: {wait_seconds: .inf}\n", "feedback.wait_seconds"),
    ("nan.json", '{"model": "local/demo", "seed": NaN}', "run.json"),
    ("nul-model.json", '{"model": "x\\u0000y"}', "model"),
    ("surrogate.json", '{"model": "x\\ud800y"}', "model"),
    ("big.json", '{"model": "local/demo", "sampling": {"temperature": 1e400}}', "sampling.temperature"),
    ("bool.yaml", GOOD + "sampling: {max_tokens: true}\n", "sampling.max_tokens"),
    ("params-nan.yaml", GOOD.replace("exact_match\n", "exact_match\n    params: {x: .nan}\n"), "rewards.0.params.x"),
]

# A 1 KB config whose aliases expand to 10^8 leaves (the billion laughs).
LAUGHS = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 10)}]\n" for i in range(7)
) + "model: local/demo\n"


def _one_field(exc: ConfigInvalid) -> str:
    return " ".join(exc.errors)


# --- the parsers ----------------------------------------------------------------------------

@pytest.mark.parametrize(("filename", "text", "field"), BAD_CONFIGS)
def test_a_config_postgres_cannot_hold_is_refused_naming_the_field(filename: str, text: str, field: str) -> None:
    with pytest.raises(ConfigInvalid) as caught:
        config_parse(text=text.encode(), filename=filename if field != "run.json" else "run.json")
    assert any(field in path for path in caught.value.errors), caught.value.errors


def test_yaml_aliases_are_refused_at_once_naming_the_line() -> None:
    started = time.monotonic()
    with pytest.raises(ConfigInvalid) as caught:
        config_parse(text=LAUGHS.encode(), filename="laughs.yaml")
    assert time.monotonic() - started < 1.0
    assert caught.value.errors == {"line 2": "YAML aliases (*name) are not accepted; write the value out"}


def test_deep_nesting_is_refused_not_a_recursion_error() -> None:
    with pytest.raises(InputRejected, match="nested more than 64"):
        json_parse("[" * 50_000 + "]" * 50_000)
    with pytest.raises(InputRejected, match="nested more than 64"):
        yaml_parse("x: " + "[" * 50_000 + "]" * 50_000)


def test_a_config_that_is_not_utf8_is_refused_naming_the_line() -> None:
    with pytest.raises(ConfigInvalid) as caught:
        config_parse(text="model: local/demo\nname: café\n".encode("latin-1"), filename="c.yaml")
    assert caught.value.errors.keys() == {"line 2"}
    assert "not UTF-8 (byte 0xe9 at column 10)" in caught.value.errors["line 2"]


def test_a_huge_integer_is_refused_not_a_value_error() -> None:
    with pytest.raises(ConfigInvalid):
        config_parse(text=("seed: " + "9" * 5000).encode(), filename="c.yaml")
    with pytest.raises(ConfigInvalid):
        config_parse(text=('{"seed": ' + "9" * 5000 + "}").encode(), filename="c.json")


def test_integer_fields_hold_64_bits_while_free_form_params_keep_any_integer() -> None:
    with pytest.raises(ConfigInvalid) as caught:
        config_parse(text=(GOOD + f"seed: {2**70}\n").encode(), filename="c.yaml")
    assert caught.value.errors == {"seed": "number is too large (at most 2^63 - 1)"}
    config = config_parse(text=GOOD.replace("exact_match\n", f"exact_match\n    params: {{big: {2**70}}}\n").encode(), filename="c.yaml")
    assert config.rewards[0].params == {"big": 2**70}


def test_a_float_field_read_back_from_jsonb_as_a_large_integer_still_validates(owner: User) -> None:
    run = make_run(owner=owner, feedback={"w_auto": 9.223372036854776e18})
    run.refresh_from_db()
    from kernel.config import config_validate

    assert config_validate(data=run.config).feedback.w_auto == 9.223372036854776e18


def test_size_is_bounded_before_parsing() -> None:
    with pytest.raises(ConfigInvalid, match="at most 1048576"):
        config_parse(text=b"model: x\n" + b"#" * (1024 * 1024), filename="c.yaml")
    with pytest.raises(InputRejected, match="at most 1048576"):
        yaml_parse("x" * (1024 * 1024 + 1), where="rewards")


def test_yaml_dates_stay_text() -> None:
    assert yaml_parse("when: 2024-01-01") == {"when": "2024-01-01"}


# --- the CLI --------------------------------------------------------------------------------

@pytest.mark.parametrize(("filename", "text", "field"), BAD_CONFIGS)
def test_rft_create_refuses_a_bad_config_with_a_message(owner: User, tmp_path: Path, filename: str, text: str, field: str) -> None:
    path = tmp_path / ("run.json" if field == "run.json" else filename)
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    with pytest.raises(CommandError) as caught:
        call_command("rft", "create", str(path), "--name", "bad", "--owner", "owner")
    assert field in str(caught.value)
    assert not Run.objects.exists()


def test_rft_create_refuses_the_billion_laughs_in_a_second(owner: User, tmp_path: Path) -> None:
    path = tmp_path / "laughs.yaml"
    path.write_text(LAUGHS)
    started = time.monotonic()
    with pytest.raises(CommandError, match="line 2: YAML aliases"):
        call_command("rft", "create", str(path), "--name", "laughs", "--owner", "owner")
    assert time.monotonic() - started < 2.0
    assert not Run.objects.exists()


def test_rft_create_refuses_a_name_postgres_cannot_hold(owner: User, tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text(GOOD)
    # A name from argv with undecodable bytes arrives with lone surrogates (surrogateescape).
    with pytest.raises(CommandError, match="name: text is not valid Unicode"):
        call_command("rft", "create", str(path), "--name", "caf\udce9", "--owner", "owner")
    assert not Run.objects.exists()


def test_rft_create_exits_non_zero_with_a_message_not_a_traceback(tmp_path: Path) -> None:
    path = tmp_path / "nan.yaml"
    path.write_text(GOOD + "feedback: {w_auto: .inf}\n")
    done = subprocess.run(
        [sys.executable, "manage.py", "rft", "create", str(path), "--name", "x", "--owner", "nobody"],
        cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode != 0
    assert "feedback.w_auto: numbers must be finite" in done.stderr
    assert "Traceback" not in done.stderr


# Taskset files the issue found crashing the import, with what the error must name.
BAD_TASKSETS: list[tuple[str, bytes, str]] = [
    ("latin-1", '{"prompt": "café?"}\n'.encode("latin-1"), "line 1: not UTF-8"),
    ("utf-16", '{"prompt": "a?"}\n'.encode("utf-16"), "line 1: not UTF-8"),
    ("nul", b'{"prompt": "ok?"}\n{"prompt": "a\\u0000b"}\n', "line 2: prompt: text may not contain NUL"),
    ("surrogate", b'{"prompt": "a\\udc00b"}\n', "line 1: prompt: text is not valid Unicode"),
    ("nan", b'{"prompt": "a?", "answer": NaN}\n', "line 1: NaN is not a JSON number"),
    ("1e400", b'{"prompt": "a?", "extra": 1e400}\n', "line 1: extra: numbers must be finite"),
    ("deep", b'{"prompt": "a?", "extra": ' + b"[" * 50_000 + b"]" * 50_000 + b"}\n", "line 1: nested more than 64"),
]


@pytest.mark.parametrize(("label", "data", "message"), BAD_TASKSETS, ids=[b[0] for b in BAD_TASKSETS])
def test_a_bad_taskset_file_is_refused_naming_the_line_and_nothing_is_stored(
    owner: User, tmp_path: Path, label: str, data: bytes, message: str,
) -> None:
    path = tmp_path / "tasks.jsonl"
    path.write_bytes(data)
    with pytest.raises(ImportFailed, match=message.replace("(", r"\(")):
        taskset_import(name="bad", path=path, owner=owner)
    assert not Taskset.objects.exists() and not Task.objects.exists()


@pytest.mark.parametrize(("label", "data", "message"), BAD_TASKSETS[:4], ids=[b[0] for b in BAD_TASKSETS[:4]])
def test_rft_create_refuses_a_bad_taskset_with_the_line(owner: User, tmp_path: Path, label: str, data: bytes, message: str) -> None:
    config = tmp_path / "run.yaml"
    config.write_text(GOOD)
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_bytes(data)
    with pytest.raises(CommandError) as caught:
        call_command("rft", "create", str(config), "--name", "t", "--owner", "owner", "--taskset", str(tasks))
    assert f"taskset: {message}" in str(caught.value)
    assert not Run.objects.exists() and not Taskset.objects.exists()


# --- the web: /runs/new/ and the feedback settings form ----------------------------------------

@pytest.fixture
def web(owner: User) -> Client:
    client = Client()
    client.force_login(owner)
    return client


@pytest.mark.parametrize(("filename", "text", "field"), BAD_CONFIGS)
def test_an_uploaded_bad_config_is_400_naming_the_field(web: Client, filename: str, text: str, field: str) -> None:
    name = "run.json" if field == "run.json" else filename
    upload = SimpleUploadedFile(name, text.encode("utf-8", "surrogatepass"))
    response = web.post("/runs/new/", {"name": "r", "config_file": upload})
    assert response.status_code == 400
    page = response.content.decode()
    assert any(words in page for words in ("finite", "NUL characters", "lone surrogate", "not a JSON number", "not true/false")), page
    assert not Run.objects.exists()


def test_an_uploaded_latin1_config_is_refused_not_mangled(web: Client) -> None:
    upload = SimpleUploadedFile("c.yaml", "model: café\n".encode("latin-1"))
    response = web.post("/runs/new/", {"name": "r", "config_file": upload})
    assert response.status_code == 400
    assert "line 1" in response.content.decode() and "not UTF-8" in response.content.decode()
    assert not Run.objects.exists()


def test_the_billion_laughs_upload_is_400_at_once(web: Client) -> None:
    started = time.monotonic()
    response = web.post("/runs/new/", {"name": "r", "config_file": SimpleUploadedFile("c.yaml", LAUGHS.encode())})
    assert response.status_code == 400 and "YAML aliases" in response.content.decode()
    assert time.monotonic() - started < 2.0
    assert not Run.objects.exists()


@pytest.mark.parametrize("name", ["a\x00b", "x" * 201])
def test_a_run_name_postgres_cannot_hold_is_a_form_error(web: Client, name: str) -> None:
    upload = SimpleUploadedFile("c.yaml", GOOD.encode())
    response = web.post("/runs/new/", {"name": name, "config_file": upload})
    assert response.status_code == 400
    assert not Run.objects.exists()


@pytest.mark.parametrize(
    ("field", "value"),
    [("model", "a\x00b"), ("sampling.temperature", "nan"), ("sampling.max_tokens", "1e400"), ("rewards", "[{name: exact_match, weight: .inf}]"),
     ("sampling.stop", "[*a]")],
)
def test_the_new_run_form_refuses_what_postgres_cannot_hold(web: Client, field: str, value: str) -> None:
    response = web.post("/runs/new/", {"name": "r", "model": "local/demo", "rewards": "[{name: exact_match}]", field: value})
    assert response.status_code == 400, response.content[:500]
    assert not Run.objects.exists()


@pytest.mark.parametrize(
    ("field", "value"),
    [("feedback.w_auto", "inf"), ("feedback.wait_seconds", "1e400"), ("feedback.w_human", "NaN"), ("feedback.wait_seconds", "-Infinity")],
)
def test_the_feedback_settings_form_refuses_non_finite_numbers(web: Client, owner: User, field: str, value: str) -> None:
    run = make_run(owner=owner)
    before = dict(run.config["feedback"])
    response = web.post(f"/runs/{run.pk}/feedback-settings/", {"confirm": "yes", "feedback.mode": "blend", field: value})
    assert response.status_code < 500
    assert "finite number" in response.content.decode()
    run.refresh_from_db()
    assert run.config["feedback"] == before


def test_an_uploaded_bad_taskset_is_400_naming_the_line(web: Client) -> None:
    config = SimpleUploadedFile("c.yaml", GOOD.encode())
    tasks = SimpleUploadedFile("t.jsonl", b'{"prompt": "ok"}\n{"prompt": "a\\u0000b"}\n')
    response = web.post("/runs/new/", {"name": "r", "config_file": config, "taskset": tasks})
    assert response.status_code == 400
    assert "line 2: prompt: text may not contain NUL characters" in response.content.decode()
    assert not Run.objects.exists() and not Taskset.objects.exists()


# --- the API ---------------------------------------------------------------------------------

def _traj(**fields: Any) -> dict[str, Any]:
    return {"key": "k1", "prompt": "p", "response": "r", **fields}


@pytest.mark.parametrize(
    ("item", "field"),
    [(_traj(reward=True), "trajectories.0.reward"), (_traj(model_version=False), "trajectories.0.model_version"),
     (_traj(reward_parts={"x": True}), "trajectories.0.reward_parts.x"),
     (_traj(token_ids=[1, True, 3], prompt_length=1, logprobs=[-0.1, -0.2]), "trajectories.0.token_ids.1")],
)
def test_the_api_never_takes_a_boolean_for_a_number(run: Run, item: dict[str, Any], field: str) -> None:
    _, raw = make_key(run)
    response = Api(raw).post(f"/runs/{run.pk}/trajectories", {"trajectories": [item]})
    assert response.status_code == 422, response.content
    assert field in response.json()["errors"]
    assert not Experience.objects.filter(run=run).exists()


def test_the_api_refuses_nul_in_added_tasks_as_before(run: Run) -> None:
    _, raw = make_key(run)
    before = Task.objects.count()
    response = Api(raw).post(f"/runs/{run.pk}/tasks", raw=b'{"tasks": [{"prompt": "a\\u0000b"}]}')
    assert response.status_code == 422
    assert Task.objects.count() == before


def test_the_api_refuses_a_deep_body_cleanly(run: Run) -> None:
    _, raw = make_key(run)
    body = b'{"trajectories": ' + b"[" * 50_000 + b"]" * 50_000 + b"}"
    response = Api(raw).post(f"/runs/{run.pk}/trajectories", raw=body)
    assert response.status_code == 422 and "nested" in response.json()["detail"]


def test_a_clean_config_round_trips(web: Client) -> None:
    # The model must name a path that exists or a well-formed hub id (checked at create).
    text = json.dumps({"model": "local/demo", "repeat_times": 4, "rewards": [{"name": "exact_match", "params": {"k": [1, 2.5, None, "ü"]}}]})
    response = web.post("/runs/new/", {"name": "ok · démo", "config_file": SimpleUploadedFile("c.json", text.encode())})
    assert response.status_code == 302, response.content.decode()[-2000:]
    run = Run.objects.get()
    assert run.name == "ok · démo"
    assert run.config["rewards"][0]["params"] == {"k": [1, 2.5, None, "ü"]}


# --- every other form and query string ------------------------------------------------------

def test_nul_in_any_form_field_is_400_naming_it_and_nothing_is_written(web: Client, owner: User) -> None:
    from apps.feedback.models import Assignment, Feedback
    from tests.factories import make_experiences

    run = make_run(owner=owner)
    experience = make_experiences(run, groups=1, group_size=2)[0]
    assignment = Assignment.objects.create(run=run, experience=experience, annotator=owner, slot=0)
    posts = [
        (f"/runs/{run.pk}/annotate/experiences/{experience.pk}/edit/", {"text": "fixed\x00", "comment": "ok"}, "text"),
        (f"/runs/{run.pk}/annotate/items/{assignment.pk}/rate/", {"score": "3", "comment": "a\x00b"}, "comment"),
        (f"/runs/{run.pk}/keys/", {"name": "k\x00", "actions": ["read"], "rate_limit_per_minute": "1"}, "name"),
    ]
    for url, data, field in posts:
        response = web.post(url, data)
        assert response.status_code == 400, url
        assert response.content.decode().startswith(f"{field}: text may not contain NUL characters")
    assert not Feedback.objects.exists()
    response = web.get(f"/runs/{run.pk}/experiences/", {"domain": "a\x00b"})
    assert response.status_code == 400 and b"domain: text may not contain NUL" in response.content
