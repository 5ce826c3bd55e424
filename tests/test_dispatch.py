"""The RFT core's loop, its handlers called directly against Postgres (no workers): what it
sends, once, and what it takes back from a worker that died or a message that was lost.
The same loop with real workers killed and Postgres and Redis restarted under it is in
tests/test_faults.py. The other jobs on the same dispatch rows (reward-model training and
export) run once at a time and are taken over once a crashed one's lease ran out."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
import math
import time
from typing import Any

import psycopg
import pytest
from django.db import connection
from django.utils import timezone

from apps.buffer.models import Experience, TaskAttempt
from apps.buffer.services import batch_claim, experience_write, task_attempts_create, task_claim
from apps.control import conductor
from apps.runs.heartbeat import worker_heartbeat_record
from apps.runs.dispatch import dispatch_claim
from apps.runs.models import Dispatch, Run, WorkerHeartbeat
from apps.control.conductor import dispatch_begin, dispatch_recover, dispatch_send, conductor_beat
from tests.factories import experience_row, make_run, make_taskset

pytestmark = pytest.mark.django_db


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, list[Any], str]]:
    """What the loop queues (task name, args, task id), captured instead of sent."""
    out: list[tuple[str, list[Any], str]] = []
    monkeypatch.setattr(conductor, "_send", lambda name, args, queue, task_id: out.append((name, args, task_id)))
    return out


def _running(owner: Any, **config: Any) -> Run:
    run = make_run(owner=owner, taskset=make_taskset(8, owner=owner), **config)
    Run.objects.filter(pk=run.pk).update(status=Run.Status.RUNNING)
    run.refresh_from_db()
    return run


def _explore_out_on(run: Run, *, worker: str, holder: str, started_ago: float = 0.0) -> Dispatch:
    """Explore step 1 sent, picked up by `worker`, its tasks leased to `holder`."""
    assert dispatch_send(run=run, job="explore", step=1)
    row = Dispatch.objects.get(run=run, job="explore")
    assert dispatch_begin(run_id=run.pk, job="explore", step=1, task_id=row.task_id, worker=worker, holder=holder)
    Dispatch.objects.filter(pk=row.pk).update(started_at=timezone.now() - timedelta(seconds=started_ago))
    task_attempts_create(run=run, epoch=0)
    assert task_claim(run=run, worker=holder, size=2)
    return Dispatch.objects.get(pk=row.pk)


def _beat(hostname: str, *, ago: float = 0.0, active: Sequence[str] = (), started_ago: float = 3600.0) -> None:
    worker_heartbeat_record(hostname=hostname, queues=["rollout"], pool="solo", concurrency=1, pid=1,
                            active=[{"id": t, "name": "workers.explore.explorer.explore_step"} for t in active],
                            started_at=timezone.now() - timedelta(seconds=started_ago))
    WorkerHeartbeat.objects.filter(hostname=hostname).update(last_seen=timezone.now() - timedelta(seconds=ago))


def test_two_conductors_looking_at_once_send_a_step_once(owner: Any, sent: list[Any]) -> None:
    run = _running(owner, mode="explore")
    assert dispatch_send(run=run, job="explore", step=1) is True
    assert dispatch_send(run=run, job="explore", step=1) is False
    assert [(name, args) for name, args, _ in sent] == [("workers.explore.explorer.explore_step", [run.pk, 1])]
    row = Dispatch.objects.get(run=run, job="explore")
    assert (row.state, row.step, row.task_id, row.sends) == ("sent", 1, sent[0][2], 1)


def test_only_the_dispatched_message_runs_a_step_and_only_once(owner: Any, sent: list[Any]) -> None:
    run = _running(owner, mode="explore")
    dispatch_send(run=run, job="explore", step=1)
    task_id = sent[0][2]
    assert dispatch_begin(run_id=run.pk, job="explore", step=1, task_id="stray", worker="w", holder="h") is None
    hold = dispatch_begin(run_id=run.pk, job="explore", step=1, task_id=task_id, worker="w", holder="h")
    assert hold is not None
    # A copy of the same message (re-sent while it was thought lost) finds it running...
    assert dispatch_begin(run_id=run.pk, job="explore", step=1, task_id=task_id, worker="w2", holder="h2") is None
    hold.end()
    # ...or done, and does nothing either; the loop's next step goes out as usual.
    assert dispatch_begin(run_id=run.pk, job="explore", step=1, task_id=task_id, worker="w2", holder="h2") is None
    assert dispatch_send(run=run, job="explore", step=2)


def test_a_message_the_broker_lost_is_sent_again_under_its_id_and_runs_once(owner: Any, sent: list[Any], settings: Any) -> None:
    settings.RFT_DISPATCH_RESEND_SECONDS = 15
    run = _running(owner, mode="explore")
    dispatch_send(run=run, job="explore", step=1)
    assert dispatch_recover(run=run) == []  # just sent: waiting for a worker is normal
    Dispatch.objects.filter(run=run).update(sent_at=timezone.now() - timedelta(seconds=16))
    assert dispatch_recover(run=run) == ["explore:1 again"]
    assert sent[1] == sent[0]  # the same message again: same step, same task id
    task_id = sent[0][2]
    first = dispatch_begin(run_id=run.pk, job="explore", step=1, task_id=task_id, worker="a", holder="a")
    second = dispatch_begin(run_id=run.pk, job="explore", step=1, task_id=task_id, worker="b", holder="b")
    assert first is not None and second is None


def _copies_over(run: Run, *, seconds: float, beat: float = 0.5, alive: str = "") -> int:
    """Messages queued for the run's explore step over `seconds` of loop beats on a clock that
    advances (no wall time passes), counting the first; `alive`: a worker picked it up and
    beats, running it, all along."""
    start = timezone.now()
    copies = 1
    for i in range(1, int(seconds / beat) + 1):
        now = start + timedelta(seconds=i * beat)
        if alive:
            WorkerHeartbeat.objects.filter(hostname=alive).update(last_seen=now)
        copies += len(dispatch_recover(run=run, now=now))
    return copies


def test_a_message_waiting_on_a_busy_queue_is_sent_again_ever_more_rarely(
    owner: Any, sent: list[Any], settings: Any
) -> None:
    """No worker takes the message for ten minutes (one busy with other runs' steps): the
    first copy still goes after RFT_DISPATCH_RESEND_SECONDS, each next one after twice the
    wait, up to RFT_DISPATCH_RESEND_MAX_SECONDS. A fixed 15 s queued 40 copies over ten minutes."""
    settings.RFT_DISPATCH_RESEND_SECONDS = 15
    settings.RFT_DISPATCH_RESEND_MAX_SECONDS = 300
    run = _running(owner, mode="explore")
    dispatch_send(run=run, job="explore", step=1)
    copies = _copies_over(run, seconds=600)
    # 0, 15, 45, 105, 225 and 465 s (each a beat late): at most log2(600 / 15) + 1 copies.
    assert copies == len(sent) == 6 <= math.log2(600 / 15) + 1
    assert {task_id for _, _, task_id in sent} == {sent[0][2]}  # the same message each time
    assert Dispatch.objects.get(run=run, job="explore").copies == 6
    # Without the backoff (a cap at the first wait) it is one copy every 15 s.
    settings.RFT_DISPATCH_RESEND_MAX_SECONDS = 15
    other = _running(owner, mode="explore", name="fixed")
    dispatch_send(run=other, job="explore", step=1)
    assert _copies_over(other, seconds=600) == 39


def test_a_message_picked_up_is_not_sent_again_and_its_copies_start_over(
    owner: Any, sent: list[Any], settings: Any
) -> None:
    settings.RFT_DISPATCH_RESEND_SECONDS = 15
    settings.RFT_WORKER_DEAD_SECONDS = 10
    run = _running(owner, mode="explore")
    row = _explore_out_on(run, worker="rollout@a", holder="explorer@a:11")
    _beat("rollout@a", active=[row.task_id])
    assert _copies_over(run, seconds=600, alive="rollout@a") == 1  # running all along
    Dispatch.objects.filter(pk=row.pk).update(copies=5)  # as if it had waited long before
    _beat("rollout@a", ago=11, active=[row.task_id])  # its worker died
    assert dispatch_recover(run=run) == ["explore:1 again"]
    row = Dispatch.objects.get(pk=row.pk)
    assert (row.state, row.copies) == ("sent", 1) and row.sent_at is not None
    # Lost again on the way to the next worker: the shortest wait, not the one it was at.
    assert dispatch_recover(run=run, now=row.sent_at + timedelta(seconds=16)) == ["explore:1 again"]


def test_a_copy_the_broker_refused_is_not_counted(owner: Any, sent: list[Any], settings: Any,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    settings.RFT_DISPATCH_RESEND_SECONDS = 15
    run = _running(owner, mode="explore")
    dispatch_send(run=run, job="explore", step=1)
    row = Dispatch.objects.get(run=run, job="explore")
    assert row.sent_at is not None

    def away(*_: Any) -> None:
        raise ConnectionError("broker restarting")

    monkeypatch.setattr(conductor, "_send", away)
    with pytest.raises(ConnectionError):
        dispatch_recover(run=run, now=row.sent_at + timedelta(seconds=16))
    after = Dispatch.objects.get(pk=row.pk)
    assert (after.state, after.copies, after.sent_at) == ("sent", 1, row.sent_at)
    monkeypatch.setattr(conductor, "_send", lambda name, args, queue, task_id: sent.append((name, args, task_id)))
    # The broker is back a beat later: the copy goes then, not after a doubled wait.
    assert dispatch_recover(run=run, now=row.sent_at + timedelta(seconds=16.5)) == ["explore:1 again"]
    assert Dispatch.objects.get(pk=row.pk).copies == 2


def test_a_dead_explorers_step_is_sent_again_and_its_tasks_go_back_within_seconds(
    owner: Any, sent: list[Any], settings: Any
) -> None:
    settings.RFT_WORKER_DEAD_SECONDS = 10
    run = _running(owner, mode="explore")
    row = _explore_out_on(run, worker="rollout@a", holder="explorer@a:11", started_ago=30)
    _beat("rollout@a", ago=5, active=[row.task_id])
    assert dispatch_recover(run=run) == []  # a beat 5 s ago: alive
    _beat("rollout@a", ago=11, active=[row.task_id])
    assert dispatch_recover(run=run) == ["explore:1 again"]
    assert sent[-1] == ("workers.explore.explorer.explore_step", [run.pk, 1], row.task_id)
    assert not TaskAttempt.objects.filter(run=run, status="leased").exists()  # back in the queue at once
    assert Dispatch.objects.get(pk=row.pk).state == "sent"


def test_a_worker_restarted_under_the_same_name_lost_what_it_was_running(owner: Any, sent: list[Any]) -> None:
    run = _running(owner, mode="explore")
    row = _explore_out_on(run, worker="rollout@a", holder="explorer@a:11", started_ago=3)
    _beat("rollout@a", ago=0, started_ago=1)  # up again since a second, beating
    assert dispatch_recover(run=run) == ["explore:1 again"]
    assert not TaskAttempt.objects.filter(run=run, status="leased").exists()
    assert sent[-1][2] == row.task_id


def test_a_live_worker_that_no_longer_runs_the_step_gives_it_back_but_keeps_its_leases(
    owner: Any, sent: list[Any], settings: Any
) -> None:
    settings.RFT_WORKER_DEAD_SECONDS = 10
    run = _running(owner, mode="explore")
    row = _explore_out_on(run, worker="rollout@a", holder="explorer@a:11", started_ago=30)
    _beat("rollout@a", ago=1, active=[])  # alive, running something else (its end was not recorded)
    assert dispatch_recover(run=run) == ["explore:1 again"]
    # It may yet write them (keyed by attempt, so nothing twice); they come back by lease.
    assert TaskAttempt.objects.filter(run=run, status="leased").count() == 2


def test_a_step_on_a_busy_live_worker_is_left_alone(owner: Any, sent: list[Any]) -> None:
    run = _running(owner, mode="explore")
    row = _explore_out_on(run, worker="rollout@a", holder="explorer@a:11", started_ago=600)
    _beat("rollout@a", ago=1, active=[row.task_id])  # ten minutes into a long step
    assert dispatch_recover(run=run) == [] and sent == [sent[0]]


def test_a_dead_trainers_step_is_sent_again_with_its_batch_back_while_a_live_ones_is_not(
    owner: Any, sent: list[Any], settings: Any
) -> None:
    settings.RFT_HEARTBEAT_SECONDS = 1
    run = _running(owner, mode="train")
    experience_write(experiences=[experience_row(run, key=f"k{i}", group="g", reward=float(i)) for i in range(4)])
    assert dispatch_send(run=run, job="train", step=1)
    task_id = sent[0][2]
    assert dispatch_begin(run_id=run.pk, job="train", step=1, task_id=task_id, worker="train@b", holder="trainer@b:7")
    assert batch_claim(run=run, worker="trainer@b:7", size=4)
    Dispatch.objects.filter(run=run).update(started_at=timezone.now() - timedelta(seconds=5))
    db = connection.settings_dict
    with psycopg.connect(host=db["HOST"] or "localhost", port=db["PORT"] or 5432, dbname=db["NAME"],
                         user=db["USER"] or None, autocommit=True) as trainer_session:
        trainer_session.execute("SELECT pg_advisory_lock(%s, %s)", [conductor.TRAINER_LOCK_NAMESPACE, run.pk])
        assert dispatch_recover(run=run) == []  # its session holds the run: it is training
    # The session is gone (the process died): the lock with it, once the server has ended the
    # session's backend (a client's close does not wait for that; under load it can take a moment).
    deadline = time.monotonic() + 10
    while (recovered := dispatch_recover(run=run)) == [] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert recovered == ["train:1 again"]
    assert set(Experience.objects.filter(run=run).values_list("status", flat=True)) == {"ready"}
    assert sent[-1] == ("workers.trainer.task.train_step", [run.pk, 1], task_id)


def test_the_loop_sends_every_running_runs_next_step_and_only_theirs(owner: Any, sent: list[Any]) -> None:
    a, b = _running(owner, mode="explore", name="a"), _running(owner, mode="explore", name="b")
    paused = make_run(owner=owner, taskset=make_taskset(owner=owner), mode="explore", name="paused")
    Run.objects.filter(pk=paused.pk).update(status=Run.Status.PAUSED)
    advanced = conductor_beat()
    assert set(advanced) == {a.pk, b.pk}
    assert sorted(args for _, args, _ in sent) == sorted([[a.pk, 1], [b.pk, 1]])
    conductor_beat()  # the next beat: both steps are still out, nothing is sent twice
    assert len(sent) == 2


def test_a_train_mode_run_waits_while_an_environment_works_on_its_tasks(owner: Any, sent: list[Any]) -> None:
    """An agent (or any environment) that claimed a train-mode run's tasks will send their
    experiences: the run does not finish on an empty buffer meanwhile; once no task is queued
    or leased, an empty buffer ends it as before."""
    run = _running(owner, mode="train", total_steps=5)
    [attempt] = task_claim(run=run, worker="agent", size=1)
    conductor.run_advance(run=run)
    run.refresh_from_db()
    assert run.status == Run.Status.RUNNING
    # The rest of the epoch is still queued after the leased one is done.
    TaskAttempt.objects.filter(pk=attempt.pk).update(status=TaskAttempt.Status.DONE)
    conductor.run_advance(run=run)
    run.refresh_from_db()
    assert run.status == Run.Status.RUNNING
    TaskAttempt.objects.filter(run=run).update(status=TaskAttempt.Status.DONE)
    conductor.run_advance(run=run)
    run.refresh_from_db()
    assert run.status == Run.Status.FINISHED and not sent


def test_an_idle_beat_writes_nothing_and_reads_the_run_once(owner: Any, sent: list[Any], settings: Any) -> None:
    """The beat comes every RFT_CONDUCT_SECONDS for every running run. With the run's step
    out (the steady state) it reads the run, its dispatches and what it needs to decide, and
    writes nothing: no send that would find the row taken, no second read of the run, and
    the table-wide lease reaping at most every twentieth of a lease (bench/async_vs_sync
    measures the conductor's CPU per beat)."""
    from django.test.utils import CaptureQueriesContext

    settings.RFT_LEASE_SECONDS = 300
    run = _running(owner, mode="explore")
    conductor_beat()
    assert [args for _, args, _ in sent] == [[run.pk, 1]]
    with CaptureQueriesContext(connection) as queries:
        conductor_beat()
        conductor_beat()
    statements = [q["sql"].lstrip().split()[0].upper() for q in queries.captured_queries]
    assert not {"UPDATE", "INSERT", "DELETE"} & set(statements), statements
    assert statements.count("SELECT") <= 2 * 3, [q["sql"][:80] for q in queries.captured_queries]
    assert len(sent) == 1


def test_a_beat_under_a_train_step_that_is_out_does_not_count_the_buffer(owner: Any, sent: list[Any]) -> None:
    """In async mode the trainer goes on from step to step itself, so its step is out at
    almost every beat: the beat then asks neither how much the buffer holds nor whether
    anything is pending (two of an async beat's six statements, half its CPU:
    bench/conductor_beat), and reads no heartbeat for a train step (the trainer's lock says
    whether it lives)."""
    from django.test.utils import CaptureQueriesContext

    run = _running(owner, mode="async", max_staleness=2)
    conductor_beat()
    assert dispatch_send(run=run, job="train", step=1)
    assert dispatch_begin(run_id=run.pk, job="train", step=1, task_id=sent[-1][2], worker="train@b", holder="trainer@b:7")
    with CaptureQueriesContext(connection) as queries:
        conductor_beat()
    tables = " ".join(q["sql"] for q in queries.captured_queries)
    assert "buffer_experience" not in tables and "runs_workerheartbeat" not in tables, tables
    assert len(queries.captured_queries) <= 3


def test_a_run_with_nothing_left_to_train_finishes_only_after_the_train_step_that_is_out(
    owner: Any, sent: list[Any]
) -> None:
    """A train-mode run whose buffer is used up ends; but not under a train step that is
    still out (its trainer would find the run finished halfway): the beat after it ends does."""
    run = _running(owner, mode="train", total_steps=5)
    TaskAttempt.objects.filter(run=run).update(status=TaskAttempt.Status.DONE)
    assert dispatch_send(run=run, job="train", step=1)
    hold = dispatch_begin(run_id=run.pk, job="train", step=1, task_id=sent[-1][2], worker="train@b", holder="trainer@b:7")
    assert hold is not None
    conductor_beat()
    run.refresh_from_db()
    assert run.status == Run.Status.RUNNING
    hold.end()
    conductor_beat()
    run.refresh_from_db()
    assert run.status == Run.Status.FINISHED


def test_the_beat_still_hands_back_an_expired_lease_once_reaping_is_due(owner: Any, sent: list[Any],
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    run = _running(owner, mode="explore")
    task_attempts_create(run=run, epoch=0)
    [attempt] = task_claim(run=run, worker="gone", size=1, lease_seconds=30)
    TaskAttempt.objects.filter(pk=attempt.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    monkeypatch.setattr(conductor, "_last_reap", float("-inf"))
    conductor_beat()
    assert TaskAttempt.objects.get(pk=attempt.pk).status == TaskAttempt.Status.QUEUED


def test_the_loops_beat_task_costs_no_edge_heartbeat_but_a_step_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """An edge heartbeat is a new thread, a new database connection and an upsert: for the
    loop's beat (every RFT_CONDUCT_SECONDS, milliseconds of work) it was most of the
    conductor worker's CPU per beat. Steps still beat at their edges (the workers page shows
    the step a worker runs at once)."""
    import threading
    import types

    from apps.runs import heartbeat
    from apps.control.conductor_beat import conductor_beat_task
    from workers.trainer.task import train_step

    beats: list[str] = []

    class Beater:
        def is_alive(self) -> bool:
            return True

        def beat(self) -> None:
            beats.append("beat")

    fake_threading = types.SimpleNamespace(
        Thread=lambda target, args, daemon: types.SimpleNamespace(start=lambda: target(*args)),
        current_thread=threading.current_thread, main_thread=threading.main_thread,
    )
    monkeypatch.setattr(heartbeat, "_beater", Beater())
    monkeypatch.setattr(heartbeat, "threading", fake_threading)
    heartbeat._on_task_edge(sender=conductor_beat_task)
    assert beats == []
    heartbeat._on_task_edge(sender=train_step)
    assert beats == ["beat"]


@pytest.mark.django_db(transaction=True)
def test_an_edge_heartbeats_thread_closes_its_connection_when_it_ends(settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Workers keep their connections between tasks (RFT_WORKER_CONN_MAX_AGE), which Django's
    close_old_connections respects: a step's edge heartbeat runs on a thread that then ends,
    and must close its own connection, or each one stays open until the garbage collector
    (two a step: a restarted Postgres once ran out of connection slots in tests/test_faults)."""
    import threading

    from django.db import close_old_connections, connections

    from apps.runs import heartbeat
    from workers.trainer.task import train_step

    for database in settings.DATABASES.values():
        monkeypatch.setitem(database, "CONN_MAX_AGE", 300)
    used: list[Any] = []

    class Beater:
        def is_alive(self) -> bool:
            return True

        def beat(self) -> None:
            from apps.runs.models import WorkerHeartbeat

            WorkerHeartbeat.objects.count()  # the beat's query, on this thread's own connection
            used.append(connections["default"])
            close_old_connections()  # as _Beater.beat ends

    monkeypatch.setattr(heartbeat, "_beater", Beater())
    before = set(threading.enumerate())
    heartbeat._on_task_edge(sender=train_step)
    for thread in set(threading.enumerate()) - before:
        thread.join(timeout=10)
    assert len(used) == 1 and used[0] is not connections["default"]
    assert used[0].connection is None, "the edge thread left its connection open"


# ----------------------------------------------------------------------------- other jobs


def test_a_second_reward_model_training_while_one_runs_starts_nothing_and_a_crashed_ones_lease_runs_out(
    owner: Any,
) -> None:
    from workers.reward.trainer import TRAIN_LEASE_SECONDS, reward_model_train

    run = make_run(owner=owner, reward_model={"enabled": True})
    training = dispatch_claim(run_id=run.pk, job="rm_train", state="running", worker="reward@a",
                              lease_seconds=TRAIN_LEASE_SECONDS)
    assert training is not None
    assert reward_model_train(run.pk) == {"version": None, "busy": True}  # a second trigger meanwhile
    training.end()
    assert reward_model_train(run.pk) == {"version": None, "accuracy": None}  # ran: nothing was due
    # A training whose worker crashed never ends its hold: the next trigger waits out its lease.
    crashed = dispatch_claim(run_id=run.pk, job="rm_train", state="running", worker="reward@b",
                             lease_seconds=TRAIN_LEASE_SECONDS)
    assert crashed is not None
    assert reward_model_train(run.pk)["busy"] is True
    Dispatch.objects.filter(run=run, job="rm_train").update(expires_at=timezone.now() - timedelta(seconds=1))
    taker = dispatch_claim(run_id=run.pk, job="rm_train", state="running", worker="reward@c", lease_seconds=60)
    assert taker is not None
    crashed.end()  # the crashed one, come back late, frees nothing of its successor's
    row = Dispatch.objects.get(run=run, job="rm_train")
    assert (row.state, row.worker, row.task_id) == ("running", "reward@c", taker.task_id)
    taker.end()
    assert reward_model_train(run.pk) == {"version": None, "accuracy": None}


@pytest.mark.django_db(transaction=True)
def test_two_claims_at_once_from_two_sessions_give_one_holder(owner: Any) -> None:
    """The conditional UPDATE decides between concurrent claimers: a second session's claim,
    blocked on the first's uncommitted row, finds it taken once the first commits."""
    import threading

    from django.db import close_old_connections, transaction

    run = make_run(owner=owner)
    Dispatch.objects.create(run=run, job="k12_train")
    won: list[bool] = []
    second_started = threading.Event()

    def second() -> None:
        try:
            second_started.set()
            won.append(dispatch_claim(run_id=run.pk, job="k12_train", state="running", lease_seconds=60) is not None)
        finally:
            close_old_connections()

    with transaction.atomic():
        assert dispatch_claim(run_id=run.pk, job="k12_train", state="running", lease_seconds=60) is not None
        other = threading.Thread(target=second)
        other.start()
        second_started.wait(5)
        other.join(0.5)
        assert won == []  # blocked on the row until this transaction commits
    other.join(10)
    assert won == [False]
    assert Dispatch.objects.get(run=run, job="k12_train").state == "running"


def test_the_loop_leaves_other_jobs_to_their_leases(owner: Any, sent: list[Any], settings: Any) -> None:
    settings.RFT_DISPATCH_TTL = 1
    run = _running(owner, mode="explore")
    dispatch_claim(run_id=run.pk, job="rm_train", state="running", worker="reward@quiet", lease_seconds=1800)
    dispatch_claim(run_id=run.pk, job="rm_export", key="v1", state="sent", lease_seconds=1800)
    Dispatch.objects.exclude(job="explore").update(started_at=timezone.now() - timedelta(hours=1),
                                                    sent_at=timezone.now() - timedelta(hours=1))
    conductor_beat()
    assert [(name, args) for name, args, _ in sent] == [("workers.explore.explorer.explore_step", [run.pk, 1])]
    assert dict(Dispatch.objects.filter(run=run).values_list("job", "state")) == {
        "explore": "sent", "rm_train": "running", "rm_export": "sent"}


def test_version_0_is_evaluated_once_when_the_run_starts(owner: Any, sent: list[Any], monkeypatch: pytest.MonkeyPatch,
                                                         django_capture_on_commit_callbacks: Any) -> None:
    """A run's gains (and its twin's, apps/control/twins.py) count from the model it started
    from: the advance that records version 0 sends its evaluation, once; a run without an
    evaluation taskset sends none."""
    asked: list[tuple[int, int]] = []
    monkeypatch.setattr(conductor, "eval_dispatch", lambda *, run_id, version: asked.append((run_id, version)))
    heldout = make_taskset(4, owner=owner)
    run = _running(owner, mode="explore", eval_every=2, eval={"taskset": heldout.pk})
    plain = _running(owner, mode="explore")
    with django_capture_on_commit_callbacks(execute=True):
        conductor.run_advance(run=run)
        conductor.run_advance(run=run)
        conductor.run_advance(run=plain)
    assert asked == [(run.pk, 0)]
