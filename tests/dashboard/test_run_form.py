"""The new-run form guides (issue 32, item 3): every error of a submission at once, each
beside its field; presets for the common runs and "copy from run N"; advanced sections folded
with their values summarised; a model directory checked before the run is made, naming what
it lacks. Through Django's test client here; in a real browser at the end."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from apps.control.presets import PRESETS
from kernel.config import config_validate
from apps.runs.models import Run
from apps.runs.services import model_name_errors
from tests.dashboard.test_views import field_block
from tests.factories import make_run, make_taskset, make_user

pytestmark = pytest.mark.django_db


def model_dir(root: Path, *, config: bool = True, weights: bool = True, tokenizer: bool = True) -> Path:
    """A directory laid out as save_pretrained leaves one (empty files: only names are checked)."""
    root.mkdir(parents=True, exist_ok=True)
    for wanted, name in ((config, "config.json"), (weights, "model.safetensors"), (tokenizer, "tokenizer.json")):
        if wanted:
            (root / name).write_text("{}")
    return root


@pytest.fixture
def browser_user(client: Client, owner: User) -> Client:
    client.force_login(owner)
    return client


def form_section(html: str, sid: str) -> str:
    match = re.search(rf'<details class="form-section card" data-form-section="{re.escape(sid)}"[^>]*>(.*?)</details>', html, re.S)
    assert match, f"no form section {sid}"
    return match.group(0)


# --- every error at once, beside its field ---------------------------------------------------

def test_garbage_yaml_a_negative_learning_rate_and_a_missing_model_are_all_reported_in_one_submit(
        browser_user: Client) -> None:
    response = browser_user.post("/runs/new/", {
        "name": "three problems", "model": "/no/such/model", "algorithm": "grpo", "repeat_times": "4",
        "rewards": "- name: [unclosed", "trainer.learning_rate": "-0.001",
    })
    assert response.status_code == 400
    html = response.content.decode()
    assert "no such file or directory: /no/such/model" in field_block(html, "model")
    assert "YAML" in field_block(html, "rewards") or "line" in field_block(html, "rewards")
    assert "Learning rate must be more than 0" in field_block(html, "trainer.learning_rate")
    assert "3 problems to fix" in html
    # The sections holding an error are open; a clean advanced section stays folded.
    assert " open>" in form_section(html, "trainer")
    assert " open>" not in form_section(html, "sampling")
    assert not Run.objects.exists()


def test_a_folder_without_a_tokenizer_is_refused_naming_the_missing_part(browser_user: Client, tmp_path: Path) -> None:
    folder = model_dir(tmp_path / "no-tokenizer", tokenizer=False)
    response = browser_user.post("/runs/new/", {"name": "x", "model": str(folder), "rewards": "- name: exact_match"})
    assert response.status_code == 400
    said = field_block(response.content.decode(), "model")
    assert "no tokenizer" in said and "tokenizer.json" in said and "sentencepiece" not in said
    assert not Run.objects.exists()


@pytest.mark.parametrize("missing, said", [
    ({"config": False}, "no config.json"), ({"weights": False}, "no weights"), ({"tokenizer": False}, "no tokenizer"),
    ({"weights": False, "tokenizer": False}, "no weights"),
])
def test_a_model_directory_names_each_part_it_lacks(tmp_path: Path, missing: dict[str, bool], said: str) -> None:
    folder = model_dir(tmp_path / "m", **missing)
    message = model_name_errors(name=str(folder))["model"]
    assert said in message
    assert message.count("no ") == list(missing.values()).count(False)


def test_a_model_name_the_file_system_refuses_is_a_field_error_not_a_500() -> None:
    # Found by tests/test_hygiene_properties.py: a 4,000-character name made stat() raise.
    message = model_name_errors(name="9" * 4000)["model"]
    assert "not a usable path" in message and len(message) < 200


def test_a_complete_model_directory_passes_and_a_separate_tokenizer_may_hold_the_tokenizer(tmp_path: Path) -> None:
    assert model_name_errors(name=str(model_dir(tmp_path / "full"))) == {}
    bare = model_dir(tmp_path / "bare", tokenizer=False)
    tokenizer = tmp_path / "tok"
    tokenizer.mkdir()
    assert model_name_errors(name=str(tokenizer), field="tokenizer") == {"tokenizer": f"{tokenizer} has no tokenizer "
                                                                                      "(tokenizer.json, tokenizer.model or vocab.json)"}
    (tokenizer / "tokenizer.json").write_text("{}")
    assert model_name_errors(name=str(bare), tokenizer_elsewhere=True) == {}
    assert model_name_errors(name=str(tokenizer), field="tokenizer") == {}


def test_a_real_model_folder_made_by_save_pretrained_is_accepted(tmp_path: Path, browser_user: Client) -> None:
    from workers.models.tiny import tiny_model_save

    folder = tiny_model_save(tmp_path / "tiny", hidden_size=16, layers=1, heads=2)
    taskset = make_taskset(owner=User.objects.get(username="owner"))
    response = browser_user.post("/runs/new/", {"name": "real", "model": str(folder), "taskset_id": str(taskset.pk),
                                                "rewards": "- name: exact_match"})
    assert response.status_code == 302, response.content.decode()[-2000:]
    assert Run.objects.get().cfg.model == str(folder)


# --- presets and copies ------------------------------------------------------------------------

@pytest.mark.parametrize("preset", PRESETS, ids=[p.slug for p in PRESETS])
def test_every_preset_is_a_valid_config_once_a_model_is_named(preset: Any) -> None:
    config_validate(data={**preset.config, "model": "org/model"})


@pytest.mark.parametrize("preset", PRESETS, ids=[p.slug for p in PRESETS])
def test_a_preset_fills_the_form_and_creating_from_it_makes_that_run(browser_user: Client, preset: Any) -> None:
    html = browser_user.get(f"/runs/new/?preset={preset.slug}").content.decode()
    assert preset.title in html
    assert f'<option value="{preset.config["algorithm"]}" selected' in field_block(html, "algorithm")
    # What a browser posts: every field as the form shows it, with a name and a model added.
    posted = form_values(html)
    posted.update(name=f"from {preset.slug}", model="org/model")
    response = browser_user.post("/runs/new/", posted)
    assert response.status_code == 302, errors_of(response.content.decode())
    run = Run.objects.get(name=f"from {preset.slug}")
    expected = config_validate(data={**preset.config, "model": "org/model"})
    assert run.cfg == expected


def test_copy_from_run_n_fills_the_form_with_its_config_and_makes_the_same_run(browser_user: Client, owner: User) -> None:
    source = make_run(owner=owner, taskset=make_taskset(owner=owner), name="original", repeat_times=6,
                      sampling={"temperature": 0.7, "max_tokens": 99}, feedback={"mode": "blend", "w_human": 0.8})
    html = browser_user.get(f"/runs/new/?from={source.pk}").content.decode()
    assert "Copied from run “original”" in html and 'value="original (copy)"' in html
    assert "temperature 0.7 · max tokens 99" in form_section(html, "sampling")
    posted = form_values(html)
    posted["taskset_id"] = str(source.taskset_id)
    response = browser_user.post("/runs/new/", posted)
    assert response.status_code == 302, errors_of(response.content.decode())
    copy = Run.objects.get(name="original (copy)")
    assert copy.cfg == source.cfg and copy.taskset_id == source.taskset_id


def test_a_run_one_may_not_see_cannot_be_copied(browser_user: Client) -> None:
    hidden = make_run(owner=make_user("someone-else"), name="private")
    response = browser_user.get(f"/runs/new/?from={hidden.pk}")
    assert response.status_code == 404
    assert "private" not in response.content.decode()


def test_folded_sections_say_what_differs_from_the_defaults(browser_user: Client) -> None:
    html = browser_user.get("/runs/new/").content.decode()
    assert " open>" in form_section(html, "run")
    for gid in ("run.more", "sampling", "trainer", "feedback", "reward_model", "pipeline"):
        assert " open>" not in form_section(html, gid), gid
    assert "defaults" in form_section(html, "sampling")
    assert ">off<" in form_section(html, "trainer.lora")  # no LoRA unless a rank is given
    html = browser_user.get("/runs/new/?preset=human-preference").content.decode()
    assert "mode learned" in form_section(html, "feedback") and "enabled on" in form_section(html, "reward_model")


# --- helpers: what a browser would post ---------------------------------------------------------

def form_values(html: str) -> dict[str, str]:
    """The run form's fields as a browser submits them (text inputs, selects, textareas,
    checked boxes)."""
    form = re.search(r'<form method="post"[^>]*id="run-form".*?</form>', html, re.S)
    assert form
    body = form.group(0)
    values: dict[str, str] = {}
    for m in re.finditer(r'<input id="[^"]+" type="text"[^>]*?name="([^"]+)" value="([^"]*)"', body):
        values[m.group(1)] = _unescape(m.group(2))
    for m in re.finditer(r'<input id="[^"]+" type="checkbox" name="([^"]+)"[^>]*?( checked)?>', body):
        if m.group(2):
            values[m.group(1)] = "on"
    for m in re.finditer(r'<select id="id_[^"]+" name="([^"]+)"[^>]*>(.*?)</select>', body, re.S):
        chosen = re.search(r'<option value="([^"]*)" selected', m.group(2)) or re.search(r'<option value="([^"]*)"', m.group(2))
        values[m.group(1)] = _unescape(chosen.group(1)) if chosen else ""
    for m in re.finditer(r'<textarea id="[^"]+" name="([^"]+)"[^>]*>(.*?)</textarea>', body, re.S):
        values[m.group(1)] = _unescape(m.group(2))
    values.pop("csrfmiddlewaretoken", None)
    return values


def _unescape(text: str) -> str:
    import html

    return html.unescape(text)


def errors_of(html: str) -> list[str]:
    return re.findall(r'<p class="field-error[^"]*"[^>]*>(.*?)</p>', html)


def test_one_submit_of_the_run_form_validates_the_config_once(browser_user: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    """The form checks the config (every error at once), run_create stores it and the page's
    warnings read it: the RunConfig validated by the first is passed on (issue 65 item 5: four
    validations a submit before, the form's, run_create's two and the stored row read back)."""
    from kernel.config import RunConfig

    validated: list[object] = []
    original = RunConfig.model_validate

    def counting(data: object, *args: Any, **kwargs: Any) -> RunConfig:
        validated.append(data)
        return original(data, *args, **kwargs)

    monkeypatch.setattr(RunConfig, "model_validate", counting)
    response = browser_user.post("/runs/new/", {"name": "once", "model": "org/model", "rewards": "- name: exact_match"})
    assert response.status_code == 302, errors_of(response.content.decode())
    assert len(validated) == 1
    assert Run.objects.get(name="once").cfg.model == "org/model"
