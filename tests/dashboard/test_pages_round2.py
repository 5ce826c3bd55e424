"""Issue 32 in a real browser, by persona, at a phone's and a laptop's width (390 and 1280 px):
what a person sees and that what they did took effect. The owner's guided run form (every
error at once, a preset, a copy), a newcomer's invitation link, the annotator's finished run
(summary, no invitation to rate, the weights download through a real train worker), staff
deactivating an account, and the run page's fixes (a failure clears the waiting banner, one
confirmation for the policy, a constants table of constants). Screenshots go to
var/screenshots/ (ignored; with `make screenshots`) for a reviewer."""

from __future__ import annotations

import re
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import expect

from apps.feedback.models import Feedback
from apps.runs.metrics import metric_record
from apps.runs.models import ModelVersion, Run, RunMember
from apps.runs.services import run_transition
from tests.dashboard.test_pages_live import in_a_thread
from tests.dashboard.test_run_form import model_dir
from tests.factories import add_member, make_experiences, make_run, make_taskset, make_user
from tests.servers import BROWSER_WAIT_MS, celery_worker, screenshot

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

PASSWORD = "pw-for-tests-only"
PHONE = {"width": 390, "height": 844}
LAPTOP = {"width": 1280, "height": 720}


def shot(page: Any, name: str) -> None:
    width = page.viewport_size["width"] if page.viewport_size else 0
    screenshot(page, f"{name}-{width}")


def no_sideways_scroll(page: Any) -> None:
    wide = page.evaluate("() => document.documentElement.scrollWidth - window.innerWidth")
    assert wide <= 0, f"{page.url} is {wide} px wider than the window"


@pytest.fixture
def open_page(browser: Any, live_url: str) -> Iterator[Any]:
    """open_page(user, size) -> a logged-in page in a context of its own."""
    contexts: list[Any] = []

    def opener(user: User | None, size: dict[str, int] = LAPTOP) -> Any:
        context = browser.new_context(base_url=live_url, viewport=size)
        contexts.append(context)
        page = context.new_page()
        page.set_default_timeout(BROWSER_WAIT_MS)
        if user is not None:
            page.goto("/login/")
            page.fill("#id_username", user.username)
            page.fill("#id_password", PASSWORD)
            page.click("button[type=submit]")
            page.wait_for_url("**/runs/")
        return page

    yield opener
    for context in contexts:
        context.close()


# --- the owner: a run form that guides ----------------------------------------------------------

@pytest.mark.parametrize("size", [PHONE, LAPTOP], ids=["390", "1280"])
def test_the_owner_sees_every_error_at_once_beside_its_field_then_creates_from_a_preset(
        open_page: Any, owner: User, tmp_path: Path, size: dict[str, int]) -> None:
    taskset = make_taskset(owner=owner, name="arith")
    page = open_page(owner, size)
    page.goto("/runs/new/")
    page.fill("#id_name", "three problems")
    page.fill("#id_model", "/no/such/model")
    page.fill("#id_rewards", "- name: [unclosed")
    page.click("details[data-form-section=trainer] > summary")
    page.fill("[id='id_trainer.learning_rate']", "-0.001")
    page.click("#run-form button[type=submit]")
    page.wait_for_selector("#error-count")
    assert "3 problems to fix" in page.inner_text("#error-count")
    for path, said in (("model", "no such file or directory"), ("rewards", "line"),
                       ("trainer.learning_rate", "Learning rate must be more than 0")):
        error = page.locator(f".field[data-field='{path}'] .field-error")
        expect(error).to_be_visible()
        assert said in error.inner_text(), (path, error.inner_text())
    # What was typed is kept; the trainer box is open because it holds an error, sampling is not.
    assert page.input_value("#id_model") == "/no/such/model"
    assert page.locator("details[data-form-section=trainer]").get_attribute("open") is not None
    assert page.locator("details[data-form-section=sampling]").get_attribute("open") is None
    no_sideways_scroll(page)
    shot(page, "new-run-errors")
    assert not Run.objects.exists()

    # A preset fills the form; its folded boxes say what they changed.
    page.click("a[data-preset=dpo-preferences]")
    page.wait_for_selector("a[data-preset=dpo-preferences][aria-current]")
    assert page.input_value("#id_algorithm") == "dpo"
    assert "mode human" in page.inner_text("details[data-form-section=feedback] [data-summary]")
    folder = model_dir(tmp_path / "my-model")
    page.fill("#id_name", "from a preset")
    page.fill("#id_model", str(folder))
    page.select_option("#id_taskset_id", str(taskset.pk))
    # Editing a folded box updates its line before it is sent.
    page.click("details[data-form-section=sampling] > summary")
    page.fill("[id='id_sampling.max_tokens']", "128")
    expect(page.locator("details[data-form-section=sampling] [data-summary]")).to_contain_text("max tokens 128")
    no_sideways_scroll(page)
    shot(page, "new-run-preset")
    page.click("#run-form button[type=submit]")
    page.wait_for_url(re.compile(r".*/runs/\d+/$"))
    run = Run.objects.get(name="from a preset")
    assert (run.cfg.algorithm, run.cfg.feedback.mode, run.cfg.repeat_times, run.cfg.sampling.max_tokens) == (
        "dpo", "human", 2, 128)
    assert run.taskset_id == taskset.pk and run.cfg.trainer.lora is None

    # Copy from that run: the same config, under a new name.
    page.goto("/runs/new/")
    page.select_option("#id_from", str(run.pk))
    page.click("#copy-from button")
    page.wait_for_selector("text=Copied from run")
    page.fill("#id_name", "second")
    page.click("#run-form button[type=submit]")
    page.wait_for_url(re.compile(r".*/runs/\d+/$"))
    assert Run.objects.get(name="second").cfg == run.cfg


def test_a_folder_without_a_tokenizer_is_named_on_the_form(open_page: Any, owner: User, tmp_path: Path) -> None:
    page = open_page(owner, PHONE)
    page.goto("/runs/new/?preset=grpo-math")
    page.fill("#id_name", "no tokenizer")
    page.fill("#id_model", str(model_dir(tmp_path / "half", tokenizer=False)))
    page.click("#run-form button[type=submit]")
    error = page.locator(".field[data-field=model] .field-error")
    expect(error).to_contain_text("no tokenizer (tokenizer.json")
    assert "sentencepiece" not in error.inner_text()


# --- a newcomer: an invitation link -----------------------------------------------------------

def test_a_one_time_link_makes_an_account_that_annotates_that_run_and_nothing_else(
        open_page: Any, owner: User) -> None:
    run = make_run(owner=owner, taskset=make_taskset(owner=owner), name="team", feedback={"mode": "blend"})
    other = make_run(owner=owner, taskset=make_taskset(owner=owner), name="secret", feedback={"mode": "blend"})
    make_experiences(run, groups=1, group_size=2, status="pending")
    page = open_page(owner)
    page.goto(f"/runs/{run.pk}/")
    page.select_option("#id_invite_role", "annotator")
    page.click(".invite-add button[type=submit]")
    link = page.locator("#id_invite_link").input_value()
    assert "/invite/" in link
    assert page.locator(".open-invitations li").count() == 1
    screenshot(page.locator("#invitations"), "run-invitations-1280")

    newcomer = open_page(None, PHONE)
    newcomer.goto(link)
    assert "Join “team”" in newcomer.inner_text("h1")
    no_sideways_scroll(newcomer)
    shot(newcomer, "invitation")
    newcomer.fill("#id_username", "nia")
    newcomer.click("#invitation button[type=submit]")
    newcomer.wait_for_selector("#set-password")
    no_sideways_scroll(newcomer)
    shot(newcomer, "set-password")
    newcomer.fill("#id_new_password1", "a-long-enough-password-7")
    newcomer.fill("#id_new_password2", "a-long-enough-password-7")
    newcomer.click("#set-password button[type=submit]")
    newcomer.wait_for_url("**/runs/")
    assert "Your password is set" in newcomer.inner_text(".messages")
    rows = newcomer.locator("tr[data-run]")
    assert rows.count() == 1 and rows.first.get_attribute("data-run") == str(run.pk)
    newcomer.click(f"tr[data-run='{run.pk}'] a.annotate-link")
    # The page settles first: once its live stream is open it selects and scrolls to the first
    # card (a click forced through mid-scroll once landed beside the radio, under load).
    newcomer.wait_for_selector("#annotate[data-live=open]")
    card = newcomer.locator("#queue .item:not(.done)").first
    assignment = card.get_attribute("data-assignment")
    card.locator("input[name=score][value='4']").check()
    card.locator("form.rate button[type=submit]").click()
    expect(newcomer.locator(f'#queue .item.done[data-assignment="{assignment}"]')).to_contain_text("4/5")
    assert Feedback.objects.get(author__username="nia").run_id == run.pk
    assert RunMember.objects.get(user__username="nia").role == "annotator"
    # Nothing else: another run is not there for them, nor the owner's pages of this one.
    assert newcomer.goto(f"/runs/{other.pk}/").status == 404
    assert newcomer.goto(f"/runs/{run.pk}/signal/raters/").status == 403
    assert newcomer.goto("/accounts/").url.split("?")[0].endswith("/login/")
    # The link was for one person.
    again = open_page(None)
    assert again.goto(link).status == 404 and "not valid" in again.inner_text("#invitation")


# --- staff: deactivating an account --------------------------------------------------------------

def test_staff_deactivate_an_account_from_the_accounts_page(open_page: Any) -> None:
    staff = make_user("root", staff=True)
    make_user("olga")
    wide = open_page(staff, LAPTOP)
    wide.goto("/accounts/")
    shot(wide, "accounts")
    page = open_page(staff, PHONE)
    page.click("header.topbar a:text('Accounts')")
    page.wait_for_selector("#accounts")
    no_sideways_scroll(page)
    expect(page.locator("tr[data-account=olga] button")).to_be_in_viewport()
    shot(page, "accounts")
    page.click("tr[data-account=olga] button")
    expect(page.locator("tr[data-account=olga]")).to_have_attribute("data-active", "0")
    assert "olga is deactivated" in page.inner_text(".messages")
    assert not User.objects.get(username="olga").is_active
    login = open_page(None, PHONE)
    login.goto("/login/")
    login.fill("#id_username", "olga")
    login.fill("#id_password", PASSWORD)
    login.click("button[type=submit]")
    login.wait_for_load_state()
    assert login.url.split("?")[0].endswith("/login/")


# --- the annotator: a finished run ------------------------------------------------------------

@pytest.fixture
def finished_with_weights(owner: User, annotator: User, tmp_path: Path) -> Iterator[Run]:
    """A run about to finish, its version 2 a real (tiny) model. The live server reads the
    zip from its own storage (the checkout's var/storage): the worker writes it there too,
    and it is removed afterwards."""
    import shutil

    from django.conf import settings

    from workers.models.tiny import tiny_model_save

    version = tiny_model_save(tmp_path / "v2", hidden_size=16, layers=1, heads=2, seed=7)
    run = make_run(owner=owner, taskset=make_taskset(owner=owner), name="finished", total_steps=2,
                   model=str(version), feedback={"mode": "blend"})
    add_member(run, annotator)
    run_transition(run=run, action="start", actor=owner)
    make_experiences(run, groups=1, group_size=2, status="pending")
    for step in (1, 2):
        metric_record(run=run, step=step, values={"explore/reward_mean": 0.3 * step})
        ModelVersion.objects.create(run=run, number=step, checkpoint=str(version), train_step=step)
    Run.objects.filter(pk=run.pk).update(explore_step=2, train_step=2, current_version=2)
    run.refresh_from_db()
    yield run
    shutil.rmtree(Path(settings.RFT_STORAGE_DIR) / "runs" / str(run.pk) / "exports", ignore_errors=True)


def test_a_run_that_finishes_stops_inviting_annotation_and_its_summary_downloads_a_loadable_model(
        open_page: Any, annotator: User, finished_with_weights: Run, tmp_path: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    run = finished_with_weights
    annotating = open_page(annotator, PHONE)
    annotating.goto(f"/runs/{run.pk}/annotate/")
    annotating.wait_for_selector("#queue .item")
    annotating.wait_for_selector("#annotate[data-live=open]")
    # It finishes while they look: the page says so and puts the queue away.
    in_a_thread(lambda: run_transition(run=run, action="finish"))
    expect(annotating.locator("#annotate-closed")).to_be_visible(timeout=BROWSER_WAIT_MS)
    assert "finished: it takes no more feedback" in annotating.inner_text("#annotate-closed")
    assert annotating.locator(".queue-col").is_hidden()
    annotating.reload()
    assert annotating.locator("#queue .item").count() == 0
    shot(annotating, "annotate-finished")

    home = open_page(annotator, PHONE)
    row = home.locator(f"tr[data-run='{run.pk}']")
    assert row.locator("a.annotate-link").count() == 0
    shot(home, "runs-list-annotator")

    with celery_worker("train", name="summary-train", log=tmp_path / "train.log", includes=("workers.weights.download",)):
        for size in (PHONE, LAPTOP):
            page = open_page(annotator, size)
            page.goto(f"/runs/{run.pk}/")
            page.wait_for_selector("#summary")
            assert page.locator("a.button.annotate-link").count() == 0
            assert "train 2 · explore 2 of 2" in page.inner_text("#summary [data-figure=steps]")
            assert "0.300" in page.inner_text("#summary tr[data-metric='explore/reward_mean']")
            no_sideways_scroll(page)
            shot(page, "run-summary")
        page.click("#weights-prepare")
        page.wait_for_selector("#weights-download", timeout=180_000)
        with page.expect_download() as download:
            page.click("#weights-download")
        archive = tmp_path / "weights.zip"
        download.value.save_as(archive)
    assert download.value.suggested_filename == f"run-{run.pk}-v2-weights.zip"
    with zipfile.ZipFile(archive) as zf:
        zf.extractall(tmp_path / "unzipped")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "unzipped", dtype=torch.float32)
    original = AutoModelForCausalLM.from_pretrained(run.cfg.model, dtype=torch.float32)
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), original.state_dict().values(), strict=True))
    shot(page, "run-summary-ready")


# --- the run page's fixes ------------------------------------------------------------------------

def test_a_failure_clears_the_waiting_banner_and_saving_the_feedback_settings_asks_once(open_page: Any, owner: User) -> None:
    from tests.dashboard.test_pages_states import _pending

    run = make_run(owner=owner, taskset=make_taskset(owner=owner), name="waits", feedback={"mode": "blend"})
    run_transition(run=run, action="start", actor=owner)
    _pending(run, "g1", 2)
    page = open_page(owner, PHONE)
    dialogs: list[str] = []

    def answer(dialog: Any) -> None:
        dialogs.append(dialog.message)
        dialog.accept()

    page.on("dialog", answer)
    page.goto(f"/runs/{run.pk}/")
    page.wait_for_selector("#live[data-state=live]")
    assert page.locator("#waiting .wait").count() >= 1
    in_a_thread(lambda: run_transition(run=run, action="fail", reason="explore step 1 failed 3 times in a row"))
    page.wait_for_selector("#run-status.status-failed", timeout=BROWSER_WAIT_MS)
    # Gone with the status itself, not only once a later refresh of the box comes back (a
    # refresh that never comes, after a failed request, left it under the failure).
    expect(page.locator("#waiting .wait")).to_have_count(0, timeout=500)
    expect(page.locator("#run-error")).to_contain_text("explore step 1 failed")
    shot(page, "run-failed")

    # The feedback settings: one confirmation (the box), no dialog on top of it; the change is saved.
    page.select_option("[id='id_feedback.mode']", "human")
    page.check("#feedback-settings input[name=confirm]")
    page.click("#feedback-settings button[type=submit]")
    page.wait_for_selector("#feedback-settings .saved")
    assert dialogs == []
    run.refresh_from_db()
    assert run.cfg.feedback.mode == "human"


def test_the_constants_table_holds_only_values_that_never_changed(open_page: Any, owner: User) -> None:
    run = make_run(owner=owner, taskset=make_taskset(owner=owner), name="constants")
    run_transition(run=run, action="start", actor=owner)
    for step, batch in ((1, 64.0), (2, 64.0), (3, 40.0)):  # the last batch was short
        metric_record(run=run, step=step, values={"batch_size": batch, "learning_rate": 1e-5, "loss": 1.0 / step})
    page = open_page(owner)
    page.goto(f"/runs/{run.pk}/")
    page.wait_for_selector("#constants tr[data-metric]")
    constants = page.locator("#constants tr[data-metric]").evaluate_all("rs => rs.map(r => r.dataset.metric)")
    assert constants == ["learning_rate"]
    page.wait_for_selector("#chart-m-batch_size canvas")  # charted like any measurement


def test_the_owner_watching_a_run_sees_its_summary_appear_when_it_finishes(open_page: Any, owner: User,
                                                                             annotator: User) -> None:
    run = make_run(owner=owner, taskset=make_taskset(owner=owner), name="watched", feedback={"mode": "blend"})
    add_member(run, annotator)
    run_transition(run=run, action="start", actor=owner)
    metric_record(run=run, step=1, values={"explore/reward_mean": 0.25})
    page = open_page(owner, PHONE)
    page.goto(f"/runs/{run.pk}/")
    page.wait_for_selector("#live[data-state=live]")
    assert page.locator("a.button.annotate-link").count() == 1 and page.is_hidden("#summary")
    in_a_thread(lambda: run_transition(run=run, action="finish"))
    page.wait_for_selector("#summary[data-status=finished]", timeout=BROWSER_WAIT_MS)
    assert page.locator("a.annotate-link").count() == 0 and page.locator("#human-loop-hint").count() == 0
    assert "0.250" in page.inner_text("#summary tr[data-metric='explore/reward_mean']")
    no_sideways_scroll(page)


@pytest.mark.parametrize("size", [PHONE, LAPTOP], ids=["390", "1280"])
def test_the_pages_read_as_people_say_things(open_page: Any, owner: User, annotator: User, size: dict[str, int]) -> None:
    from apps.feedback.kinds.flag import feedback_flag
    from apps.feedback.kinds.rating import feedback_rate
    from apps.rewards.gold import gold_item_mark

    anonymous = open_page(None, size)
    anonymous.goto("/login/")
    anonymous.click("text=Forgot your password?")
    anonymous.wait_for_selector("#id_email")
    no_sideways_scroll(anonymous)
    shot(anonymous, "password-reset")

    run = make_run(owner=owner, taskset=make_taskset(owner=owner), name="words", feedback={"mode": "blend"})
    add_member(run, annotator)
    run_transition(run=run, action="start", actor=owner)
    exps = make_experiences(run, groups=1, group_size=2, status="pending")
    feedback_rate(run=run, experience=exps[0], score=4, author=annotator)
    feedback_flag(run=run, experience=exps[0], flags=["broken"], author=annotator)
    gold_item_mark(run=run, experience_id=exps[1].pk, score=5, actor=owner)
    page = open_page(owner, size)
    page.goto(f"/runs/{run.pk}/signal/raters/")
    assert "1 rater over 1 rated item." in page.inner_text("#agreement")
    assert page.inner_text("[data-figure=gold-answer]") == "5★"
    shot(page, "raters-wording")
    page.goto(f"/runs/{run.pk}/audit/")
    assert "started by owner" in page.inner_text("#audit")
    mine = open_page(annotator, size)
    mine.goto(f"/runs/{run.pk}/annotate/")
    assert "flag" in mine.inner_text("#mine") and "flagged: broken" not in mine.inner_text("#mine")
