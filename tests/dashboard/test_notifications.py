"""A run that ends tells its people (issue 32 item 5, W&B style): in the page header and on
the notifications page, and by email to the owner and to members who asked for it. Every door
that ends a run goes through one service: the worker's failure through the ports, the loop's
finish, the stop button, the `rft` command. Told once per end, however often it is reported.
Django's locmem outbox holds the emails; the Celery task runs eagerly, through Celery."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core import mail
from django.core.management import call_command
from django.test import Client
from django.utils import timezone

from apps.control.notifications import notification_preference_set, run_end_notify
from apps.control.conductor import run_finish
from apps.runs.failures import task_failure_record
from apps.runs.metrics import metric_record
from apps.runs.models import AuditEntry, Notification, Run
from apps.runs.services import run_transition
from rftweb.celery import app
from tests.factories import add_member, make_run, make_taskset, make_user

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def eager_tasks() -> Iterator[None]:
    """Tasks queued run at once in this process, through Celery (its retry policy included)."""
    before = app.conf.task_always_eager, app.conf.task_eager_propagates
    app.conf.task_always_eager, app.conf.task_eager_propagates = True, False
    yield
    app.conf.task_always_eager, app.conf.task_eager_propagates = before


def person(username: str) -> User:
    user = make_user(username)
    user.email = f"{username}@example.org"
    user.save(update_fields=["email"])
    return user


def a_running_run(name: str = "math tutor") -> tuple[Run, User, User]:
    """Ada owns a running run; Bo annotates it."""
    ada, bo = person("ada"), person("bo")
    run = make_run(owner=ada, taskset=make_taskset(owner=ada), name=name)
    add_member(run, bo)
    Run.objects.filter(pk=run.pk).update(status=Run.Status.RUNNING)
    run.refresh_from_db()
    return run, ada, bo


def badge_of(user: User) -> str:
    client = Client()
    client.force_login(user)
    return client.get("/notifications/badge/").content.decode()


def test_a_run_whose_worker_fails_emails_its_owner_the_reason_and_a_link_and_shows_a_badge_to_both(
        eager_tasks: None) -> None:
    run, ada, bo = a_running_run()
    metric_record(run=run, step=1, values={"explore/reward_mean": 0.1})
    metric_record(run=run, step=2, values={"explore/reward_mean": 0.5})

    task_failure_record(run_id=run.pk, task="workers.trainer.task.train_step", step=3, worker="gpu-1",
                        exception=RuntimeError("CUDA out of memory"), fail_now=True)

    run.refresh_from_db()
    assert run.status == Run.Status.FAILED
    # The owner gets the email (on by default); Bo, a member, did not ask for it.
    assert [m.to for m in mail.outbox] == [["ada@example.org"]]
    email = mail.outbox[0]
    assert email.subject == f"Run “math tutor” (#{run.pk}) failed"
    assert "Why it failed: train step 3 RuntimeError: CUDA out of memory" in email.body
    assert "reward (explored): 0.100 → 0.500 (best 0.500 at step 2)" in email.body  # the summary's figures
    assert f"http://localhost:8000/runs/{run.pk}/#summary" in email.body
    # Both see it in the header.
    assert 'data-unread="1"' in badge_of(ada) and 'data-unread="1"' in badge_of(bo)


def test_an_end_reported_twice_tells_nobody_twice(eager_tasks: None) -> None:
    run, ada, bo = a_running_run()
    for _ in range(2):  # the worker reports the same failure again after the run failed
        task_failure_record(run_id=run.pk, task="workers.explore.explorer.explore_step", step=1, worker="gpu-1",
                            exception=ValueError("bad tokenizer"), fail_now=True)
    # A redelivered task message runs the service again for the same end.
    end = AuditEntry.objects.get(run=run, action="fail")
    assert run_end_notify(run_id=run.pk, audit_id=end.pk) == 0
    assert Notification.objects.filter(run=run).count() == 2  # Ada and Bo, once each
    assert len(mail.outbox) == 1


def test_a_member_who_opted_in_is_emailed_when_the_loop_finishes_the_run_and_an_owner_who_opted_out_is_not(
        eager_tasks: None) -> None:
    run, ada, bo = a_running_run("long sft")
    notification_preference_set(run=run, user=bo, email=True)
    notification_preference_set(run=run, user=ada, email=False)

    run_finish(run=run)

    assert [m.to for m in mail.outbox] == [["bo@example.org"]]
    assert mail.outbox[0].subject == f"Run “long sft” (#{run.pk}) finished"
    assert "Why it failed" not in mail.outbox[0].body
    assert set(Notification.objects.filter(run=run).values_list("user__username", "state")) == {
        ("ada", "finished"), ("bo", "finished")}


def test_the_stop_button_and_the_command_each_tell_the_people_of_their_run(eager_tasks: None) -> None:
    run, ada, bo = a_running_run("stopped by hand")
    owner = Client()
    owner.force_login(ada)
    assert owner.post(f"/runs/{run.pk}/control/stop/", {"confirm": "yes"}).status_code == 302
    assert Notification.objects.filter(run=run, user=bo, state="stopped").count() == 1
    assert mail.outbox[-1].subject == f"Run “stopped by hand” (#{run.pk}) was stopped"

    # Started again and stopped from the command line: a new end, told again.
    Run.objects.filter(pk=run.pk).update(status=Run.Status.RUNNING)
    call_command("rft", "stop", str(run.pk), "--as", "ada")
    assert Notification.objects.filter(run=run, user=bo, state="stopped").count() == 2
    assert len(mail.outbox) == 2


def test_an_email_backend_that_is_down_is_retried_and_the_email_goes_out_once_it_is_back(settings: Any) -> None:
    run, ada, _ = a_running_run()
    settings.EMAIL_BACKEND = "tests.dashboard.test_notifications.DownBackend"
    run = run_transition(run=run, action="fail", reason="disk full")
    end = AuditEntry.objects.get(run=run, action="fail")
    with pytest.raises(OSError):
        run_end_notify(run_id=run.pk, audit_id=end.pk)
    # The in-app notifications are there already; the email waits for the retry.
    assert Notification.objects.filter(run=run, emailed_at__isnull=True).count() == 2
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    assert run_end_notify(run_id=run.pk, audit_id=end.pk) == 1
    assert run_end_notify(run_id=run.pk, audit_id=end.pk) == 0
    assert len(mail.outbox) == 1 and "disk full" in mail.outbox[0].body


class DownBackend:
    def __init__(self, **_: Any) -> None:
        pass

    def send_messages(self, messages: Any) -> int:
        raise OSError("connection refused")


def test_a_person_reads_their_notifications_marks_them_read_and_turns_the_email_on(eager_tasks: None) -> None:
    run, ada, bo = a_running_run("graded")
    run_transition(run=run, action="fail", reason="reward server <b>down</b>")
    other = make_run(owner=ada, name="unrelated")
    client = Client()
    client.force_login(bo)
    page = client.get("/notifications/").content.decode()
    assert "graded" in page and "reward server &lt;b&gt;down&lt;/b&gt;" in page  # escaped
    assert f'href="/runs/{run.pk}/#summary"' in page
    # A notice seconds old reads "just now", one older than a minute its age.
    assert "just now" in page and "0 minutes" not in page
    Notification.objects.filter(run=run, user=bo).update(created_at=timezone.now() - timedelta(minutes=5))
    assert "5\xa0minutes ago" in client.get("/notifications/").content.decode()  # timesince's nbsp
    # Bo cannot mark Ada's notification read, only his own.
    adas = Notification.objects.get(run=run, user=ada)
    client.post("/notifications/read/", {"id": str(adas.pk)})
    assert Notification.objects.get(pk=adas.pk).read_at is None
    assert client.post("/notifications/read/", {"id": "x"}).status_code == 302
    client.post("/notifications/read/")
    assert 'data-unread' not in badge_of(bo) and 'data-unread="1"' in badge_of(ada)

    # His email choice for the run: off by default for a member, then on.
    assert f'data-run="{run.pk}"' in page and f'data-run="{other.pk}"' not in page
    client.post(f"/notifications/runs/{run.pk}/email/", {"email": "on"})
    Run.objects.filter(pk=run.pk).update(status=Run.Status.RUNNING)
    run_transition(run=run, action="stop")
    assert ["bo@example.org"] in [m.to for m in mail.outbox]
    # A run he is not on: no such choice to make.
    assert client.post(f"/notifications/runs/{other.pk}/email/", {"email": "on"}).status_code == 404
