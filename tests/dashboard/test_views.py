"""The dashboard's pages through Django's test client: creation form, controls, feedback settings edits,
permissions, escaping, exports."""

from __future__ import annotations

import importlib
import io
import json
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from django.apps import apps as django_apps
from django.contrib.auth.models import User
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import connection
from django.test import Client

from apps.buffer.models import Taskset
from apps.runs.metrics import metric_record
from apps.runs.models import AuditEntry, Run
from apps.runs.selectors import audit_text
from apps.runs.services import run_transition
from tests.factories import found, make_experiences, taskset_of

audit_rename = importlib.import_module("apps.runs.migrations.0013_audit_feedback_settings")

pytestmark = pytest.mark.django_db


@pytest.fixture
def client_of(client: Client):  # type: ignore[no-untyped-def]
    def login(user: User) -> Client:
        client.force_login(user)
        return client

    return login


def field_block(html: str, path: str) -> str:
    """The markup of the form field named by its dotted path."""
    match = re.search(rf'<div class="field[^"]*" data-field="{re.escape(path)}">(.*?)</div>', html, re.DOTALL)
    assert match, f"no field {path}"
    return match.group(1)


def form_data(**overrides: str) -> dict[str, str]:
    data = {"name": "my run", "model": "local/demo", "algorithm": "grpo", "repeat_times": "4",
            "rewards": "- name: exact_match"}
    data.update(overrides)
    return data


def test_a_config_error_shows_beside_its_field(client_of, owner: User) -> None:
    response = client_of(owner).post("/runs/new/", form_data(**{"sampling.temperature": "-1", "trainer.learning_rate": "fast"}))
    assert response.status_code == 400
    html = response.content.decode()
    assert "Temperature must be at least 0" in field_block(html, "sampling.temperature")
    assert "Learning rate must be a number" in field_block(html, "trainer.learning_rate")
    # Other fields keep what was typed and carry no error.
    assert "field-error" not in field_block(html, "sampling.top_p")
    assert 'value="-1"' in field_block(html, "sampling.temperature")
    assert not Run.objects.exists()


def test_an_unknown_reward_shows_beside_the_rewards_box(client_of, owner: User) -> None:
    response = client_of(owner).post("/runs/new/", form_data(rewards="- name: no_such_reward"))
    assert "unknown reward &#x27;no_such_reward&#x27;" in field_block(response.content.decode(), "rewards")


def test_a_config_file_with_an_unknown_key_fails_naming_the_key(client_of, owner: User) -> None:
    upload = SimpleUploadedFile("run.yaml", b"model: local/demo\nmax_stalness: 2\nsampling:\n  temperature: 9\n")
    response = client_of(owner).post("/runs/new/", {"name": "from file", "config_file": upload})
    assert response.status_code == 400
    html = response.content.decode()
    assert "unknown key &#x27;max_stalness&#x27;" in field_block(html, "config_file")
    # The file's other errors land beside their fields, with the file's values shown.
    assert "Temperature must be at most 5" in field_block(html, "sampling.temperature")
    assert 'value="9"' in field_block(html, "sampling.temperature")
    assert not Run.objects.exists()


def test_a_run_is_created_from_the_form_with_a_jsonl_taskset(client_of, owner: User) -> None:
    lines = "\n".join(json.dumps({"question": f"{i}+{i}?", "answer": str(2 * i), "domain": "math"}) for i in range(5))
    upload = SimpleUploadedFile("arith.jsonl", lines.encode())
    response = client_of(owner).post("/runs/new/", {**form_data(**{"feedback.mode": "blend", "sampling.temperature": "0.7"}), "taskset": upload})
    assert response.status_code == 302
    run = Run.objects.get()
    assert response["Location"] == f"/runs/{run.pk}/"
    assert run.cfg.feedback.mode == "blend" and run.cfg.sampling.temperature == 0.7
    assert run.cfg.rewards[0].name == "exact_match"
    assert taskset_of(run).tasks.count() == 5 and taskset_of(run).name == "arith"


def test_a_run_is_created_from_a_parquet_taskset_and_a_json_config_file(client_of, owner: User) -> None:
    buf = io.BytesIO()
    pq.write_table(pa.table({"prompt": ["a?", "b?", "c?"], "answer": ["a", "b", "c"]}), buf)
    config = {"model": "local/demo", "algorithm": "dpo", "mode": "async", "max_staleness": 2}
    response = client_of(owner).post("/runs/new/", {
        "name": "dpo run",
        "config_file": SimpleUploadedFile("run.json", json.dumps(config).encode()),
        "taskset": SimpleUploadedFile("tasks.parquet", buf.getvalue()),
    })
    assert response.status_code == 302, response.content.decode()[:2000]
    run = Run.objects.get()
    assert (run.cfg.algorithm, run.cfg.mode, run.cfg.max_staleness) == ("dpo", "async", 2)
    assert list(taskset_of(run).tasks.values_list("prompt", flat=True)) == ["a?", "b?", "c?"]


def test_a_bad_taskset_shows_beside_its_field_and_leaves_nothing_behind(client_of, owner: User) -> None:
    upload = SimpleUploadedFile("bad.jsonl", b'{"prompt": "ok"}\n{"prompt": \n')
    response = client_of(owner).post("/runs/new/", {**form_data(), "taskset": upload})
    assert response.status_code == 400
    assert "line 2: not valid JSON" in field_block(response.content.decode(), "taskset")
    assert not Run.objects.exists() and not Taskset.objects.exists()


def test_the_runs_list_shows_status_version_sparkline_buffer_and_last_event(client_of, owner: User, run: Run) -> None:
    for step in range(1, 6):
        metric_record(run=run, step=step, values={"reward/mean": step / 10})
    make_experiences(run, groups=1, group_size=3)
    run_transition(run=run, action="start", actor=owner)
    html = client_of(owner).get("/runs/").content.decode()
    row = found(rf'<tr data-run="{run.pk}"[^>]*>(.*?)</tr>', html, re.DOTALL).group(1)
    assert "status-running" in row and "grpo" in row and "v0" in row
    assert "<polyline" in row and "0.500" in row
    assert "ready 3" in row
    assert "started by owner" in row


def test_only_the_owner_controls_a_run_and_others_see_no_buttons(client_of, run: Run, annotator: User, outsider: User) -> None:
    c = client_of(annotator)
    assert "control-start" not in c.get(f"/runs/{run.pk}/").content.decode()
    assert c.post(f"/runs/{run.pk}/control/start/", {"confirm": "yes"}).status_code == 403
    c.force_login(outsider)
    assert c.get(f"/runs/{run.pk}/").status_code == 404
    run.refresh_from_db()
    assert run.status == Run.Status.DRAFT


def test_a_control_without_javascript_asks_for_confirmation_first(client_of, owner: User, run: Run) -> None:
    c = client_of(owner)
    page = c.get(f"/runs/{run.pk}/control/start/")
    assert page.status_code == 200 and "Start run" in page.content.decode()
    run.refresh_from_db()
    assert run.status == Run.Status.DRAFT
    done = c.post(f"/runs/{run.pk}/control/start/", {"confirm": "yes"})
    assert done.status_code == 302
    run.refresh_from_db()
    assert run.status == Run.Status.RUNNING
    entry = AuditEntry.objects.get(run=run)
    assert (entry.action, entry.actor) == ("start", owner)


def test_a_control_that_does_not_apply_says_why(client_of, owner: User, run: Run) -> None:
    response = client_of(owner).post(f"/runs/{run.pk}/control/pause/", {"confirm": "yes"}, HTTP_HX_REQUEST="true")
    assert response.status_code == 200
    assert "cannot pause a run that is draft" in response.content.decode()


def test_editing_the_feedback_settings_is_confirmed_validated_and_audited(client_of, owner: User, run: Run) -> None:
    c = client_of(owner)
    url = f"/runs/{run.pk}/feedback-settings/"
    feedback = {"feedback.mode": "blend", "feedback.w_auto": "0.3", "feedback.w_human": "0.7",
                "feedback.wait_seconds": "60", "feedback.fallback": "auto", "feedback.overlap": "2", "feedback.rank_rule": "borda"}
    unconfirmed = c.post(url, feedback, HTTP_HX_REQUEST="true")
    assert "tick the box" in unconfirmed.content.decode()
    bad = c.post(url, {**feedback, "feedback.overlap": "99", "confirm": "yes"}, HTTP_HX_REQUEST="true")
    assert "Overlap must be at most 10" in field_block(bad.content.decode(), "feedback.overlap")
    run.refresh_from_db()
    assert run.cfg.feedback.mode == "auto"
    ok = c.post(url, {**feedback, "confirm": "yes"})
    assert ok.status_code == 302
    run.refresh_from_db()
    assert (run.cfg.feedback.mode, run.cfg.feedback.w_human, run.cfg.feedback.overlap) == ("blend", 0.7, 2)
    entry = AuditEntry.objects.get(run=run, action="feedback_settings")
    assert entry.actor == owner and entry.detail["before"]["mode"] == "auto" and entry.detail["after"]["mode"] == "blend"


@pytest.mark.parametrize("method", ["get", "post"])
def test_the_feedback_settings_old_path_redirects_keeping_the_method(client_of, owner: User, run: Run,
                                                                     method: str) -> None:
    # 308: a browser re-sends a POST (a form open in an old tab) to the new path as a POST.
    response = getattr(client_of(owner), method)(f"/runs/{run.pk}/feedback-policy/")
    assert response.status_code == 308
    assert response["Location"] == f"/runs/{run.pk}/feedback-settings/"


def test_stored_feedback_policy_audit_rows_read_as_feedback_settings(owner: User, run: Run) -> None:
    old = AuditEntry.objects.create(run=run, actor=owner, action="feedback_policy", detail={})
    with connection.schema_editor() as editor:
        audit_rename.forwards(django_apps, editor)
    old.refresh_from_db()
    assert old.action == "feedback_settings"
    assert audit_text(action=old.action, actor=owner) == "feedback settings changed by owner"


def test_model_output_is_escaped_in_the_group_view(client_of, owner: User, run: Run) -> None:
    exps = make_experiences(run, groups=1, group_size=2, response_text='<img src=x onerror="alert(1)">')
    html = client_of(owner).get(f"/runs/{run.pk}/groups/{exps[0].group_id}/").content.decode()
    assert "<img src=x" not in html and "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;" in html


def test_partials_requested_without_htmx_are_whole_pages(client_of, owner: User, run: Run) -> None:
    c = client_of(owner)
    for url in (f"/runs/{run.pk}/timeline/", f"/runs/{run.pk}/controls/", "/runs/workers/", f"/runs/{run.pk}/audit/"):
        full = c.get(url).content.decode()
        fragment = c.get(url, HTTP_HX_REQUEST="true").content.decode()
        assert "<html" in full and "<html" not in fragment, url


def test_a_bad_filter_is_named_not_a_server_error(client_of, owner: User, run: Run) -> None:
    response = client_of(owner).get(f"/runs/{run.pk}/experiences/?reward_min=lots&status=nope")
    html = response.content.decode()
    assert response.status_code == 400
    # Each error beside its own field, with what was typed kept.
    reward_min = found(r'data-filter="reward_min">(.*?)</div>', html, re.DOTALL).group(1)
    assert "&#x27;lots&#x27; is not a number" in reward_min and 'value="lots"' in reward_min
    assert "unknown status &#x27;nope&#x27;" in found(r'data-filter="status">(.*?)</div>', html, re.DOTALL).group(1)


def test_an_export_downloads_as_streamed_jsonl(client_of, owner: User, run: Run) -> None:
    make_experiences(run, groups=3, group_size=4)
    response = client_of(owner).get(f"/runs/{run.pk}/export/dpo.jsonl?min_margin=1.5")
    assert response.streaming and response["Content-Disposition"].endswith('dpo.jsonl"')
    rows = [json.loads(line) for line in b"".join(response.streaming_content).splitlines()]
    assert len(rows) == 3 and all(set(r) == {"prompt", "chosen", "rejected"} for r in rows)
    assert client_of(owner).get(f"/runs/{run.pk}/export/ppo.jsonl").status_code == 400
    assert client_of(owner).get(f"/runs/{run.pk}/export/sft.jsonl?min_reward=high").status_code == 400


def test_form_errors_are_plain_words_naming_the_field(client_of, owner: User) -> None:
    """Issue 45 item 5: pydantic's wording ("Input should be greater than or equal to 1",
    "Field required") never reaches the form; each error names its field by its label."""
    response = client_of(owner).post("/runs/new/", form_data(**{
        "model": "", "total_steps": "0", "repeat_times": "many", "mode": "sideways", "sampling.top_p": "2"}))
    assert response.status_code == 400
    html = response.content.decode()
    assert "Model is required" in field_block(html, "model")
    assert "Total steps must be at least 1" in field_block(html, "total_steps")
    assert "Repeat times must be a whole number" in field_block(html, "repeat_times")
    assert "Mode must be one of" in field_block(html, "mode")
    assert "Top p must be at most 1" in field_block(html, "sampling.top_p")
    for pydantic_words in ("Input should", "Field required", "valid integer", "greater than or equal", "less than or equal"):
        assert pydantic_words not in html


def test_the_browsers_favicon_request_finds_the_icon(client: Client) -> None:
    # Every browser asks for /favicon.ico; the newcomer crawl found it a 404 in the console.
    from django.contrib.staticfiles import finders

    answer = client.get("/favicon.ico")
    assert answer.status_code == 301 and answer["Location"] == "/static/rftweb/favicon.svg"
    assert finders.find("rftweb/favicon.svg")  # served as every static file is
