"""Large taskset uploads import on a Celery task (issue #33): a file past
RFT_UPLOAD_BACKGROUND_BYTES is stored, the run is created at once, and the run page and the
API show rows imported / total; a bad line fails the import naming it and keeps no task; a
refused form keeps neither the taskset nor the stored file; the run cannot start before the
import is done."""

from __future__ import annotations

import json
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from django.utils import timezone

from apps.buffer import importers
from apps.buffer.models import Task, Taskset
from apps.buffer.tasks import taskset_import_task
from apps.runs.models import Run
from apps.runs.services import RunCannotStart, run_transition
from tests.dashboard.test_views import form_data
from tests.envapi.conftest import Api, make_key

pytestmark = pytest.mark.django_db


def jsonl(n: int, *, bad_line: int | None = None) -> bytes:
    lines = [json.dumps({"prompt": f"What is {i} + {i}?", "answer": str(2 * i), "domain": "math"}) for i in range(n)]
    if bad_line is not None:
        lines[bad_line - 1] = '{"prompt": "unfinished'
    return ("\n".join(lines) + "\n").encode()


@pytest.fixture
def background(settings: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Uploads past 1,000 bytes import in the background, committed 20 rows at a time."""
    settings.RFT_UPLOAD_BACKGROUND_BYTES = 1000
    settings.RFT_STORAGE_DIR = tmp_path / "storage"
    monkeypatch.setattr(importers, "BACKGROUND_CHUNK", 20)
    return tmp_path / "storage" / "uploads"


def imports_sent(callbacks: list[Any]) -> int:
    return sum("taskset_import_queued" in c.__qualname__ for c in callbacks)


def upload_run(client: Client, data: bytes, filename: str = "big.jsonl", **form: str) -> Any:
    return client.post("/runs/new/", {**form_data(**form), "taskset": SimpleUploadedFile(filename, data)})


def test_a_large_upload_creates_the_run_at_once_and_its_page_and_the_api_follow_the_import(
    owner: User, background: Path, django_capture_on_commit_callbacks: Any,
) -> None:
    client = Client()
    client.force_login(owner)
    with django_capture_on_commit_callbacks(execute=False) as enqueued:
        created = upload_run(client, jsonl(50))
    assert created.status_code == 302
    assert imports_sent(enqueued) == 1  # the import task, sent once the run's transaction commits
    run = Run.objects.get()
    taskset = Taskset.objects.get()
    assert run.taskset == taskset and taskset.import_status == "queued" and not Task.objects.exists()
    assert [p.suffix for p in background.iterdir()] == [".jsonl"]

    page = client.get(f"/runs/{run.pk}/").content.decode()
    assert "Importing taskset “big” (queued)" in page
    poll = f'href="/runs/{run.pk}/taskset-import/" hx-get="/runs/{run.pk}/taskset-import/"'
    assert poll in page and 'data-every="2"' in page  # polled through static/rftweb/refresh.js
    with pytest.raises(RunCannotStart, match="still being imported"):
        run_transition(run=run, action="start", actor=owner)
    api = Api(make_key(run)[1])
    assert api.get(f"/runs/{run.pk}/taskset").json()["import_status"] == "queued"

    assert taskset_import_task(taskset.pk) == "ready"

    answer = api.get(f"/runs/{run.pk}/taskset").json()
    assert answer == {"id": taskset.pk, "name": "big", "import_status": "ready", "rows_imported": 50,
                      "rows_total": 50, "error": "", "tasks": 50}
    assert list(Task.objects.filter(taskset=taskset).values_list("index", flat=True)) == list(range(50))
    assert not list(background.iterdir())  # the stored file is gone once imported
    done = client.get(f"/runs/{run.pk}/taskset-import/", headers={"HX-Request": "true"}).content.decode()
    assert "Taskset “big” imported: 50 rows." in done and "hx-get" not in done  # the polling stops
    assert "Importing" not in client.get(f"/runs/{run.pk}/").content.decode()


def test_progress_is_written_as_each_chunk_commits(owner: User, background: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[int, int | None]] = []
    add = importers._TaskWriter.add

    def watching(self: Any, fields: Any) -> None:
        add(self, fields)
        row = Taskset.objects.get(pk=self.taskset.pk)
        seen.append((row.import_rows, row.import_total))

    monkeypatch.setattr(importers._TaskWriter, "add", watching)
    client = Client()
    client.force_login(owner)
    assert upload_run(client, jsonl(50)).status_code == 302
    taskset_import_task(Taskset.objects.get().pk)
    # Each chunk sees the rows before it recorded, out of the counted total.
    assert seen == [(0, 50), (20, 50), (40, 50)]
    assert Taskset.objects.get().import_rows == 50


def test_a_bad_line_fails_the_import_naming_it_and_keeps_no_task(owner: User, background: Path) -> None:
    client = Client()
    client.force_login(owner)
    assert upload_run(client, jsonl(50, bad_line=37)).status_code == 302
    run = Run.objects.get()
    assert run.taskset_id is not None
    assert taskset_import_task(run.taskset_id) == "failed"

    taskset = Taskset.objects.get()
    assert taskset.import_status == "failed" and "line 37" in taskset.import_error
    assert not Task.objects.exists()  # the 20 rows committed before line 37 are removed again
    assert not list(background.iterdir())
    page = client.get(f"/runs/{run.pk}/").content.decode()
    assert "could not be imported: line 37" in page and "No task of it was kept" in page
    answer = Api(make_key(run)[1]).get(f"/runs/{run.pk}/taskset").json()
    assert answer["import_status"] == "failed" and "line 37" in answer["error"] and answer["tasks"] == 0
    with pytest.raises(RunCannotStart, match="could not be imported: line 37"):
        run_transition(run=run, action="start", actor=owner)
    # The picker of the next run does not offer it.
    assert "big ·" not in client.get("/runs/new/").content.decode()


def test_the_task_runs_once_per_upload_and_takes_back_an_import_whose_worker_died(owner: User, background: Path) -> None:
    client = Client()
    client.force_login(owner)
    assert upload_run(client, jsonl(50)).status_code == 302
    taskset = Taskset.objects.get()
    stored = Path(taskset.source)
    kept = stored.read_bytes()
    # A worker took it and died after 20 rows, an hour and more ago.
    Taskset.objects.filter(pk=taskset.pk).update(
        import_status="importing", import_started_at=timezone.now() - timedelta(minutes=30), import_rows=20)
    Task.objects.bulk_create([Task(taskset=taskset, index=i, prompt="left over") for i in range(20)])
    assert taskset_import_task(taskset.pk) == "taken"  # not yet stale: still its worker's
    Taskset.objects.filter(pk=taskset.pk).update(import_started_at=timezone.now() - timedelta(hours=2))
    assert taskset_import_task(taskset.pk) == "ready"
    assert Task.objects.count() == 50 and not Task.objects.filter(prompt="left over").exists()
    # A second delivery of the same message does nothing.
    stored.write_bytes(kept)
    assert taskset_import_task(taskset.pk) == "taken"
    assert Task.objects.count() == 50


def test_a_refused_form_with_a_large_upload_keeps_neither_the_taskset_nor_the_file(
    owner: User, background: Path, django_capture_on_commit_callbacks: Any,
) -> None:
    client = Client()
    client.force_login(owner)
    with django_capture_on_commit_callbacks(execute=False) as enqueued:
        refused = upload_run(client, jsonl(50), name="")
    assert refused.status_code == 400
    assert "“big.jsonl” was not kept" in refused.content.decode()
    assert imports_sent(enqueued) == 0
    assert not Taskset.objects.exists() and not Run.objects.exists() and not Task.objects.exists()
    assert not list(background.iterdir())


def test_a_small_upload_still_imports_inside_the_request(owner: User, background: Path) -> None:
    client = Client()
    client.force_login(owner)
    assert upload_run(client, jsonl(5)).status_code == 302
    assert Taskset.objects.get().import_status == "ready" and Task.objects.count() == 5


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_real_worker_imports_a_large_upload_while_the_api_shows_it_going(
    owner: User, tmp_path: Path, settings: Any,
) -> None:
    from tests.servers import celery_worker

    settings.RFT_UPLOAD_BACKGROUND_BYTES = 1000
    settings.RFT_STORAGE_DIR = tmp_path / "storage"
    client = Client()
    client.force_login(owner)
    with celery_worker("default", name="imports", log=tmp_path / "worker.log", RFT_STORAGE_DIR=str(tmp_path / "storage")):
        assert upload_run(client, jsonl(5000, bad_line=None)).status_code == 302
        run = Run.objects.get()
        api = Api(make_key(run)[1])
        states = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            answer = api.get(f"/runs/{run.pk}/taskset").json()
            states.append(answer["import_status"])
            if answer["import_status"] in ("ready", "failed"):
                break
            time.sleep(0.2)
    assert answer["import_status"] == "ready", (answer, (tmp_path / "worker.log").read_text()[-2000:])
    assert answer["rows_imported"] == answer["rows_total"] == answer["tasks"] == 5000
    assert Task.objects.filter(taskset=run.taskset).count() == 5000
    assert states[0] in ("queued", "importing")
