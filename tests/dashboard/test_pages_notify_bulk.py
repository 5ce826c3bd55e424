"""Issue 32 item 5 in a real browser: a run's end reaches its people (the header's badge moves
live on the run page, the notifications page names the run, its end and the reason, and
marks read; the owner's email goes out through the console backend of the worker that ran
the task), and the experience browser's bulk actions (tick, confirm the count, the effect).
Screenshots go to var/screenshots/ (ignored; with `make screenshots`) for a reviewer."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import expect

from apps.buffer.models import Experience
from apps.runs.failures import task_failure_record
from apps.runs.models import Notification, Run
from tests.factories import add_member, make_experiences, make_run, make_taskset, make_user
from tests.dashboard.test_pages_round2 import no_sideways_scroll, shot
from tests.servers import celery_worker, login_to_runs

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

def a_person(username: str) -> User:
    user = make_user(username)
    user.email = f"{username}@example.org"
    user.save(update_fields=["email"])
    return user


@pytest.mark.parametrize("width", [390, 1280])
def test_an_annotator_watching_a_run_sees_the_badge_when_it_fails_reads_why_and_the_owner_gets_the_email(
        browser: Any, live_url: str, tmp_path: Path, width: int) -> None:
    ada, bo = a_person("ada"), a_person("bo")
    run = make_run(owner=ada, taskset=make_taskset(owner=ada), name="tutor")
    add_member(run, bo)
    Run.objects.filter(pk=run.pk).update(status=Run.Status.RUNNING)
    log = tmp_path / "worker.log"
    context = browser.new_context(base_url=live_url, viewport={"width": width, "height": 844})
    try:
        page = context.new_page()
        page.set_default_timeout(20_000)
        login_to_runs(page, "bo")
        expect(page.locator("#notifications-badge .badge")).to_have_count(0)
        page.goto(f"/runs/{run.pk}/")
        page.wait_for_selector("#live[data-state=live]")
        with celery_worker("default", name=f"notify{width}", log=log):
            task_failure_record(run_id=run.pk, task="workers.trainer.task.train_step", step=2, worker="gpu-7",
                                exception=RuntimeError("CUDA out of memory"), fail_now=True)
            # The badge moves on the page Bo has open, without a reload.
            expect(page.locator("#notifications-badge .badge")).to_have_text("1")
            # The console backend prints the whole message once it is sent (its subject may
            # come MIME-encoded: wait for the recipient line, which never is).
            deadline = time.monotonic() + 30
            while "To: ada@example.org" not in log.read_text() and time.monotonic() < deadline:
                time.sleep(0.2)
        printed = log.read_text()
        assert f"Subject: Run =?utf-8?" in printed or f"(#{run.pk}) failed" in printed, printed[-3000:]
        assert "To: ada@example.org" in printed and "To: bo@example.org" not in printed
        no_sideways_scroll(page)
        shot(page, "notify-badge")

        page.click("#notifications-badge")
        item = page.locator(f".notification[data-run='{run.pk}']")
        expect(item).to_contain_text("tutor")
        expect(item).to_contain_text("failed")
        expect(item).to_contain_text("CUDA out of memory")
        no_sideways_scroll(page)
        shot(page, "notifications")
        item.get_by_role("button", name="Mark read").click()
        expect(page.locator("#notifications-badge .badge")).to_have_count(0)
        assert Notification.objects.get(run=run, user=bo).read_at is not None
        # The link goes to the run's summary.
        page.locator(f".notification[data-run='{run.pk}'] a").first.click()
        page.wait_for_url(re.compile(rf".*/runs/{run.pk}/#summary$"))
        expect(page.locator("#summary")).to_be_visible()
    finally:
        context.close()


@pytest.mark.parametrize("width", [390, 1280])
def test_the_owner_excludes_two_ticked_rows_after_confirming_the_count_then_exports_all_matching(
        browser: Any, live_url: str, width: int) -> None:
    owner = make_user("owner")
    run = make_run(owner=owner, taskset=make_taskset(owner=owner), name="browse me")
    rows = make_experiences(run, groups=3, group_size=4)
    context = browser.new_context(base_url=live_url, viewport={"width": width, "height": 844}, accept_downloads=True)
    try:
        page = context.new_page()
        page.set_default_timeout(20_000)
        login_to_runs(page, "owner")
        page.goto(f"/runs/{run.pk}/experiences/")
        chosen = [rows[0].pk, rows[5].pk]
        for pk in chosen:
            page.check(f"input[name=ids][value='{pk}']")
        expect(page.locator("#bulk-count")).to_have_text("2 selected")
        page.select_option("#bulk-action", "exclude")
        # Choosing an action does not reload the results (the ticks stay).
        expect(page.locator("input[name=ids]:checked")).to_have_count(2)
        no_sideways_scroll(page)
        shot(page, "bulk-selected")
        page.click("#bulk-apply")
        expect(page.locator("#bulk-question")).to_have_attribute("data-count", "2")
        expect(page.locator("#bulk-question")).to_contain_text("Exclude 2 experience(s) from training?")
        shot(page, "bulk-confirm")
        page.get_by_role("button", name="Exclude from training: 2").click()
        expect(page.locator(".messages")).to_contain_text("Exclude from training: 2 experiences.")
        for pk in chosen:
            expect(page.locator(f"tr.experience[data-id='{pk}'] .tag.excluded")).to_be_visible()
        assert set(Experience.objects.filter(run=run, status="filtered").values_list("pk", flat=True)) == set(chosen)

        # Every row with a reward of at least 2, across pages: all matching the filter.
        page.fill("#f-reward-min", "2")
        page.click("#experience-filters button[type=submit]")
        page.wait_for_url("**reward_min=2**")
        page.check("#select-matching")
        matching = [e.pk for e in rows if (e.reward or 0) >= 2]
        expect(page.locator("#bulk-count")).to_have_text(f"all {len(matching)} matching selected")
        page.select_option("#bulk-action", "export")
        page.click("#bulk-apply")
        expect(page.locator("#bulk-question")).to_have_attribute("data-count", str(len(matching)))
        with page.expect_download() as download:
            page.get_by_role("button", name=f"Export JSONL: {len(matching)}").click()
        lines = Path(download.value.path()).read_text().splitlines()
        assert sorted(json.loads(line)["id"] for line in lines) == sorted(matching)
    finally:
        context.close()
