"""In the browser: a taskset past RFT_UPLOAD_BACKGROUND_BYTES on the new-run form creates the
run at once, and its page follows the background import live until it is done (issue #33)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from playwright.sync_api import expect

from apps.buffer.models import Task, Taskset
from apps.buffer.tasks import taskset_import_task
from apps.runs.models import Run
from tests.dashboard.test_pages_live import log_in
from tests.factories import make_user
from tests.servers import BROWSER_WAIT_MS
from tests.test_upload_jobs import jsonl

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def owner() -> User:
    return make_user("owner")


def test_the_run_page_follows_a_background_import_until_it_is_done(page: Any, owner: User, tmp_path: Path) -> None:
    rows = 2
    data = jsonl(rows)
    while len(data) <= settings.RFT_UPLOAD_BACKGROUND_BYTES:  # the live server's threshold (the default)
        rows *= 2
        data = jsonl(rows)
    upload = tmp_path / "big.jsonl"
    upload.write_bytes(data)
    log_in(page, owner)
    page.goto("/runs/new/")
    page.fill("#id_name", "large upload")
    page.fill("#id_model", "local/demo")
    page.fill("#id_rewards", "- name: exact_match")
    page.set_input_files("#id_taskset", str(upload))
    page.click("#run-form button[type=submit]")
    page.wait_for_url("**/runs/*/")
    run = Run.objects.get()
    expect(page.locator("#taskset-import")).to_contain_text("Importing taskset “big” (queued)")
    # No worker serves this live server's queue: the test is the worker.
    assert run.taskset_id is not None
    assert taskset_import_task(run.taskset_id) == "ready"
    expect(page.locator("#taskset-import")).to_contain_text(f"Taskset “big” imported: {rows} rows.",
                                                            timeout=BROWSER_WAIT_MS)
    assert Taskset.objects.get().import_status == "ready" and Task.objects.count() == rows
