"""The dashboard in a real browser against a real server (daphne, Postgres, Redis channel layer)."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import expect

from apps.buffer.models import Experience
from apps.feedback.kinds.flag import feedback_flag
from apps.runs.metrics import metric_record
from apps.runs.models import AuditEntry, Run
from apps.runs.services import run_transition
from tests.factories import experience_row, make_run, make_taskset, make_user
from tests.servers import BROWSER_WAIT_MS, ROOT, HeldAnswer, child_env, login_to_runs

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def log_in(page: Any, user: User) -> None:
    """`user` signs in; the runs list is there (the other live page tests use it too)."""
    login_to_runs(page, user.username)


@pytest.fixture
def running_run() -> tuple[User, Run]:
    owner = make_user("owner")
    run = make_run(owner=owner, taskset=make_taskset(owner=owner), name="demo")
    run_transition(run=run, action="start", actor=owner)
    for step in (1, 2, 3):
        metric_record(run=run, step=step, values={"reward/mean": 0.1 * step, "reward/std": 0.05, "loss": 1.0 / step})
    return owner, run


def in_another_process(code: str) -> None:
    """Run Django code in a child process (as a worker would), e.g. to publish events."""
    result = subprocess.run([sys.executable, "manage.py", "shell", "-c", code], cwd=ROOT, env=child_env(),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def in_a_thread(fn: Callable[[], object]) -> None:
    """Run `fn` off the test's thread: Playwright's sync API keeps an event loop on it, on
    which Channels' async_to_sync refuses to run."""
    from django.db import connection

    def target() -> None:
        try:
            fn()
        finally:
            connection.close()

    t = threading.Thread(target=target)
    t.start()
    t.join(30)


def points(page: Any, chart: str) -> int:
    return int(page.get_attribute(f"#chart-{chart}", "data-points"))


def test_the_reward_chart_grows_as_metrics_arrive(page: Any, running_run: tuple[User, Run]) -> None:
    owner, run = running_run
    log_in(page, owner)
    page.goto(f"/runs/{run.pk}/")
    page.wait_for_selector("#live[data-state=live]")
    assert points(page, "reward") == 3
    assert points(page, "loss") == 3

    # Published by another process, as a trainer would: the event travels through Redis.
    record = "from apps.runs.models import Run; from apps.runs.services import metric_record; "
    in_another_process(record + f"metric_record(run=Run.objects.get(pk={run.pk}), step=4, values={{'reward/mean': 0.9, 'loss': 0.2}})")
    expect(page.locator("#chart-reward")).to_have_attribute("data-points", "4", timeout=BROWSER_WAIT_MS)
    in_another_process(record + f"metric_record(run=Run.objects.get(pk={run.pk}), step=5, values={{'reward/mean': 0.95, 'kl': 0.01}})")
    expect(page.locator("#chart-reward")).to_have_attribute("data-points", "5", timeout=BROWSER_WAIT_MS)
    assert points(page, "loss") == 4  # step 5 had no loss
    # A metric no chart claims gets a chart of its own.
    page.wait_for_selector("#chart-kl")
    assert page.locator("#chart-reward canvas").count() == 1


def test_a_burst_of_metrics_arrives_in_batch_frames_and_every_point_is_drawn(page: Any, running_run: tuple[User, Run]) -> None:
    owner, run = running_run
    frames: list[str] = []
    page.on("websocket", lambda ws: ws.on("framereceived", lambda payload: frames.append(payload)))
    log_in(page, owner)
    page.goto(f"/runs/{run.pk}/")
    page.wait_for_selector("#live[data-state=live]")
    # 40 metrics back to back from one process, as a trainer logging fast would: the server
    # sends them several to a frame (apps/runs/fanout.py), in order.
    in_another_process(
        "import asyncio\nfrom apps.runs.events import event_publish_async\n"
        "async def burst():\n"
        f"    for step in range(4, 44): await event_publish_async(run_id={run.pk}, type='run.metric', "
        "payload={'step': step, 'values': {'reward/mean': step / 100}})\n"
        "asyncio.run(burst())"
    )
    expect(page.locator("#chart-reward")).to_have_attribute("data-points", "43", timeout=BROWSER_WAIT_MS)
    assert any('"type": "batch"' in f for f in frames)


def test_pause_and_resume_work_from_the_page(page: Any, running_run: tuple[User, Run]) -> None:
    owner, run = running_run
    log_in(page, owner)
    page.goto(f"/runs/{run.pk}/")
    questions: list[str] = []

    def accept(dialog: Any) -> None:
        questions.append(dialog.message)
        dialog.accept()

    page.on("dialog", accept)
    page.click("#controls a.control-pause")
    page.wait_for_selector("#controls[data-status=paused]")
    assert "Pause run" in questions[-1]
    run.refresh_from_db()
    assert run.status == Run.Status.PAUSED

    page.click("#controls a.control-resume")
    page.wait_for_selector("#controls[data-status=running]")
    run.refresh_from_db()
    assert run.status == Run.Status.RUNNING
    actions = list(AuditEntry.objects.filter(run=run).order_by("created_at").values_list("action", "actor__username"))
    assert actions[-2:] == [("pause", "owner"), ("resume", "owner")]

    # Declining the confirmation changes nothing.
    page.remove_listener("dialog", accept)
    page.once("dialog", lambda d: d.dismiss())
    page.click("#controls a.control-pause")
    page.wait_for_timeout(500)
    run.refresh_from_db()
    assert run.status == Run.Status.RUNNING


def test_the_status_follows_a_change_made_elsewhere(page: Any, running_run: tuple[User, Run]) -> None:
    owner, run = running_run
    log_in(page, owner)
    page.goto(f"/runs/{run.pk}/")
    page.wait_for_selector("#live[data-state=live]")
    in_a_thread(lambda: run_transition(run=run, action="pause", actor=None))  # as the CLI would
    page.wait_for_selector("#controls[data-status=paused]")
    assert page.locator("#controls a.control-resume").count() == 1


def test_the_experience_browser_filters(page: Any, running_run: tuple[User, Run]) -> None:
    owner, run = running_run
    annotator = make_user("annotator")
    from apps.buffer.services import experience_write

    rows = [
        experience_row(run, key=f"r{i}", group="g1" if i < 4 else "g2", reward=float(i), status="ready",
                       response_text=f"answer {i}")
        for i in range(8)
    ]
    rows += [experience_row(run, key=f"p{i}", group="g3", reward=None, status="pending",
                            response_text="<b>bold</b><script>window.pwned=1</script>") for i in range(3)]
    experience_write(experiences=rows)
    flagged = Experience.objects.get(run=run, key="r5")
    feedback_flag(run=run, experience=flagged, author=annotator, reason="odd")

    log_in(page, owner)
    page.goto(f"/runs/{run.pk}/experiences/")
    assert page.locator("tr.experience").count() == 11

    page.select_option("select[name=status]", "pending")
    expect(page.locator("tr.experience")).to_have_count(3, timeout=BROWSER_WAIT_MS)
    assert set(page.locator("tr.experience").evaluate_all("rs => rs.map(r => r.dataset.status)")) == {"pending"}
    # Model output is shown as text, never run as markup.
    assert page.locator("tr.experience td.output b").count() == 0
    assert "<b>bold</b>" in page.locator("tr.experience td.output").first.inner_text()
    assert page.evaluate("window.pwned") is None
    assert "status=pending" in page.url  # the filtered view has its own address

    page.select_option("select[name=status]", "ready")
    page.fill("input[name=reward_min]", "3")
    page.fill("input[name=reward_max]", "6")
    page.click("#experience-filters button[type=submit]")
    expect(page.locator("tr.experience")).to_have_count(4, timeout=BROWSER_WAIT_MS)
    rewards = page.locator("tr.experience").evaluate_all("rs => rs.map(r => parseFloat(r.dataset.reward))")
    assert sorted(rewards) == [3.0, 4.0, 5.0, 6.0]

    page.select_option("select[name=flagged]", "yes")
    expect(page.locator("tr.experience")).to_have_count(1, timeout=BROWSER_WAIT_MS)
    assert page.locator("tr.experience").get_attribute("data-id") == str(flagged.pk)

    page.select_option("select[name=flagged]", "")
    page.select_option("select[name=annotator]", "annotator")
    expect(page.locator("tr.experience")).to_have_count(1, timeout=BROWSER_WAIT_MS)

    # A group side by side, with its rewards and feedback.
    page.click(f"tr.experience[data-id='{flagged.pk}'] a")
    page.wait_for_selector("article.member")
    assert page.locator("article.member").count() == 4
    assert "flag" in page.locator(f"article.member[data-id='{flagged.pk}'] .feedback").inner_text()


def test_buffer_counts_and_the_weight_sync_timeline_follow_events(page: Any, running_run: tuple[User, Run]) -> None:
    owner, run = running_run
    log_in(page, owner)
    page.goto(f"/runs/{run.pk}/")
    page.wait_for_selector("#live[data-state=live]")
    assert page.inner_text("#buffer-counts [data-status=ready] b") == "0"

    def explore() -> None:
        from apps.buffer.services import experience_write
        from apps.runs.events import event_publish

        result = experience_write(experiences=[experience_row(run, key=f"e{i}", group="g") for i in range(3)])
        event_publish(run_id=run.pk, type="experience.created", payload={"ids": result.ids})

    in_a_thread(explore)
    expect(page.locator("#buffer-counts [data-status=ready] b")).to_have_text("3", timeout=BROWSER_WAIT_MS)

    def sync() -> None:
        from apps.runs.services import model_version_publish, weight_load_record

        model_version_publish(run=run, number=1, checkpoint="/ckpt/v1", train_step=1)
        weight_load_record(run=run, version=1, worker="explorer-a", seconds=0.05)

    in_a_thread(sync)
    # The compact chart: one published version, one load mark; the table is folded away.
    page.wait_for_selector("#sync-chart[data-versions='1'][data-loads='1']")
    labels = page.evaluate("() => window.rftSyncPlot.series.map(s => s.label)")
    assert labels == ["time", "published", "explorer-a"]
    page.wait_for_selector("#timeline tr[data-version='1'] .load", state="attached")
    assert "explorer-a" in page.text_content("#timeline tr[data-version='1']")
    assert page.inner_text("#run-version") == "v1"

    def skip() -> None:
        from apps.runs.services import model_version_publish, weight_load_record

        model_version_publish(run=run, number=2, checkpoint="/ckpt/v2", train_step=2)
        model_version_publish(run=run, number=3, checkpoint="/ckpt/v3", train_step=3)
        weight_load_record(run=run, version=3, worker="explorer-a", seconds=0.05)

    in_a_thread(skip)
    page.wait_for_selector("#sync-chart[data-versions='3'][data-loads='2']")
    assert page.inner_text("#sync-skipped") == "Skipped (no explorer loaded them): v2"


def test_a_load_that_comes_while_the_timeline_is_on_its_way_still_shows(page: Any, running_run: tuple[User, Run]) -> None:
    """The version's event refreshes the timeline; the load's event comes before that answer
    has arrived. The answer (read before the load) replaces the refresh link, and the load's
    refresh still runs after it: the timeline shows the load, not "not loaded yet"."""
    from apps.runs.services import model_version_publish, weight_load_record

    owner, run = running_run
    log_in(page, owner)
    page.goto(f"/runs/{run.pk}/")
    page.wait_for_selector("#live[data-state=live]")
    timeline = HeldAnswer(page, rf"/runs/{run.pk}/timeline/")
    in_a_thread(lambda: model_version_publish(run=run, number=1, checkpoint="/ckpt/v1", train_step=1))
    expect(page.locator("#run-version")).to_have_text("v1", timeout=BROWSER_WAIT_MS)
    assert timeline.wait_asked(ms=15_000), "the version's event did not refresh the timeline"
    in_a_thread(lambda: weight_load_record(run=run, version=1, worker="explorer-a", seconds=0.05))
    # The load's event was handled (the chart follows it by its own fetch).
    page.wait_for_selector("#sync-chart[data-loads='1']", timeout=BROWSER_WAIT_MS)
    timeline.release()
    expect(page.locator("#timeline tr[data-version='1'] .load")).to_contain_text("explorer-a", timeout=BROWSER_WAIT_MS)
