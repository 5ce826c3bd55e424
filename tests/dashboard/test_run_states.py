"""A run's states (issue 17): what is checked at create and start, `finished` and `failed`
through run_transition, and a run failed by failures in a row, not by one."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings

from kernel.config import ConfigInvalid
from apps.runs.failures import task_failure_record
from apps.runs.models import AuditEntry, Run, TaskFailure
from apps.runs.services import (
    RunCannotStart,
    TransitionNotAllowed,
    model_name_errors,
    run_transition,
)
from tests.factories import make_run, make_taskset

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("name, ok", [
    ("Qwen/Qwen2.5-0.5B", True), ("gpt2", True), ("local/demo", True),
    ("/no/such/dir", False), ("./missing-model", False), ("~/nope/model", False), ("a/b/c", False),
    ("org/name-", False), ("org//name", False), ("bad name", False),
])
def test_a_model_is_an_existing_path_or_a_well_formed_hub_id(name: str, ok: bool) -> None:
    assert (model_name_errors(name=name) == {}) is ok


def _saved_model(path: Path) -> Path:
    """A directory laid out as save_pretrained leaves one (only the names are checked)."""
    path.mkdir(parents=True)
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        (path / name).write_text("{}")
    return path


def test_an_existing_directory_is_accepted_whatever_its_name(tmp_path: Path) -> None:
    model = _saved_model(tmp_path / "my" / "deep" / "model")
    assert model_name_errors(name=str(model)) == {}


def test_a_run_with_a_missing_model_is_refused_at_create_naming_the_field(owner: User) -> None:
    with pytest.raises(ConfigInvalid) as refused:
        make_run(owner=owner, model="/no/such/model")
    assert set(refused.value.errors) == {"model"}
    assert not Run.objects.exists()


def test_the_cli_refuses_a_missing_model_with_a_message(owner: User, tmp_path: Path) -> None:
    config = tmp_path / "run.yaml"
    config.write_text("model: /no/such/model\nrewards:\n  - name: exact_match\n")
    with pytest.raises(CommandError, match="no such file or directory: /no/such/model"):
        call_command("rft", "create", str(config), "--name", "x", "--owner", owner.username)
    assert not Run.objects.exists()


def test_a_run_that_explores_needs_tasks_to_start_and_its_model_is_checked_again(owner: User, tmp_path: Path) -> None:
    run = make_run(owner=owner)
    with pytest.raises(RunCannotStart, match="explores tasks and this one has none"):
        run_transition(run=run, action="start", actor=owner)
    # A model directory that vanished after creation stops the start too.
    model = _saved_model(tmp_path / "model")
    run = make_run(owner=owner, taskset=make_taskset(owner=owner), model=str(model))
    import shutil

    shutil.rmtree(model)
    with pytest.raises(RunCannotStart) as refused:
        run_transition(run=run, action="start", actor=owner)
    assert set(refused.value.errors) == {"model"}
    run.refresh_from_db()
    assert run.status == Run.Status.DRAFT


def test_a_draft_cannot_be_stopped_and_a_finished_run_cannot_be_started(owner: User) -> None:
    run = make_run(owner=owner, taskset=make_taskset(owner=owner))
    with pytest.raises(TransitionNotAllowed, match="cannot stop a run that is draft"):
        run_transition(run=run, action="stop", actor=owner)
    run_transition(run=run, action="start", actor=owner)
    run_transition(run=run, action="finish")
    assert run.status == Run.Status.FINISHED
    with pytest.raises(TransitionNotAllowed, match="cannot start a run that is finished"):
        run_transition(run=run, action="start", actor=owner)
    assert list(AuditEntry.objects.filter(run=run).order_by("created_at").values_list("action", "actor")) == [
        ("start", owner.pk), ("finish", None)]


@override_settings(RFT_RUN_FAIL_AFTER=3)
def test_a_run_fails_after_failures_in_a_row_and_progress_resets_the_count(owner: User) -> None:
    run = make_run(owner=owner, taskset=make_taskset(owner=owner))
    run_transition(run=run, action="start", actor=owner)

    def fail(step: int) -> None:
        task_failure_record(run_id=run.pk, task="workers.explore.explorer.explore_step", step=step, worker="w1",
                            exception=OSError(f"cannot load step {step}"))

    fail(1)
    fail(1)
    Run.objects.filter(pk=run.pk).update(explore_step=1)  # a step got through: the count starts again
    fail(2)
    fail(2)
    run.refresh_from_db()
    assert run.status == Run.Status.RUNNING
    fail(2)
    run.refresh_from_db()
    assert run.status == Run.Status.FAILED
    assert run.error == "explore step 2 failed 3 times in a row; OSError: cannot load step 2"
    assert TaskFailure.objects.filter(run=run).count() == 5
    assert AuditEntry.objects.get(run=run, action="fail").detail == {"reason": run.error}
    # Started again (after a fix), the error is cleared and old failures no longer count.
    run_transition(run=run, action="start", actor=owner)
    run.refresh_from_db()
    assert (run.status, run.error) == (Run.Status.RUNNING, "")
    fail(2)
    run.refresh_from_db()
    assert run.status == Run.Status.RUNNING


def test_a_failure_of_a_stopped_run_is_recorded_but_changes_nothing(owner: User) -> None:
    run = make_run(owner=owner, taskset=make_taskset(owner=owner))
    run_transition(run=run, action="start", actor=owner)
    run_transition(run=run, action="stop", actor=owner)
    task_failure_record(run_id=run.pk, task="workers.trainer.task.train_step", step=1, worker="w", exception=ValueError("x"),
                        fail_now=True)
    run.refresh_from_db()
    assert run.status == Run.Status.STOPPED
    assert TaskFailure.objects.get(run=run).task == "train"


def test_only_the_owner_adds_or_removes_people(owner: User) -> None:
    from django.test import Client

    from apps.runs.models import RunMember
    from tests.factories import add_member, make_user

    run = make_run(owner=owner)
    annotator, newcomer = make_user("ann"), make_user("new")
    member = add_member(run, annotator)
    client = Client()
    client.force_login(annotator)
    assert client.post(f"/runs/{run.pk}/members/", {"username": "new", "role": "viewer"}).status_code == 403
    assert client.post(f"/runs/{run.pk}/members/{member.pk}/remove/").status_code == 403
    client.force_login(owner)
    assert client.post(f"/runs/{run.pk}/members/", {"username": "new", "role": "viewer"}).status_code == 302
    assert RunMember.objects.get(run=run, user=newcomer).role == "viewer"
    assert client.post(f"/runs/{run.pk}/members/{member.pk}/remove/").status_code == 302
    assert not RunMember.objects.filter(pk=member.pk).exists()
