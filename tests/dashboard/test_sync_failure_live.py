"""A weight sync that fails reaches an open run page live (issue 66.3): its event opens the
versions' table, which shows what failed and where, and the live line says it."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from playwright.sync_api import expect

from apps.runs.services import run_transition
from tests.factories import make_run, make_taskset, make_user
from tests.servers import BROWSER_WAIT_MS, login_to_runs

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_a_failed_sync_opens_the_timeline_naming_what_and_where(page: Any) -> None:
    owner = make_user("owner")
    run = make_run(owner=owner, taskset=make_taskset(owner=owner), name="demo")
    run_transition(run=run, action="start", actor=owner)
    login_to_runs(page, owner.username)
    page.goto(f"/runs/{run.pk}/")
    page.wait_for_selector("#live[data-state=live]")
    assert page.get_attribute("details.sync-table", "open") is None  # folded while all is well

    def fail() -> None:  # off the test's thread: Playwright keeps an event loop on it
        from django.db import connection

        from apps.runs.services import sync_failure_record

        try:
            sync_failure_record(run_id=run.pk, version=2, method="checkpoint", stage="write", where="/shared/runs/v2",
                                worker="trainer-host:41", seconds=600.0,
                                message="no answer within the run's sync_timeout_s (600 s)")
        finally:
            connection.close()

    t = threading.Thread(target=fail)
    t.start()
    t.join(30)
    row = page.locator("#timeline tr[data-version='2'] .sync-failed")
    expect(row).to_contain_text("checkpoint write failed on trainer-host:41", timeout=BROWSER_WAIT_MS)
    expect(row).to_contain_text("/shared/runs/v2")
    assert page.get_attribute("details.sync-table", "open") is not None
    expect(page.locator("#live-line")).to_contain_text("v2 checkpoint sync failed (write) on trainer-host:41")
    assert "not published" in page.text_content("#timeline tr[data-version='2']")
