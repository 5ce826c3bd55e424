"""`manage.py rft …` and worker health."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client
from django.utils import timezone

from apps.runs.heartbeat import worker_heartbeat_record, workers_health
from apps.cli.management.commands.rft import worker_plan
from apps.runs.models import AuditEntry, Run, WorkerHeartbeat
from tests.factories import make_experiences, make_run
from tests.servers import ROOT, child_env

pytestmark = pytest.mark.django_db


def rft(*args: str) -> str:
    from io import StringIO

    out = StringIO()
    call_command("rft", *args, stdout=out, stderr=StringIO())
    return out.getvalue()


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text("model: local/demo\nalgorithm: grpo\nrepeat_times: 4\nrewards:\n  - name: exact_match\n")
    return path


def test_a_run_is_created_from_a_config_file_with_its_taskset(owner: User, config_file: Path, tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("\n".join(json.dumps({"prompt": f"{i}?", "answer": str(i)}) for i in range(7)))
    out = rft("create", str(config_file), "--name", "cli run", "--owner", "owner", "--taskset", str(tasks))
    run = Run.objects.get()
    assert f"created run {run.pk}" in out
    assert run.owner == owner and run.cfg.rewards[0].name == "exact_match" and run.taskset is not None and run.taskset.tasks.count() == 7


def test_a_config_file_with_an_unknown_key_fails_naming_the_key(owner: User, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: m\nmax_stalness: 2\n")
    with pytest.raises(CommandError, match="max_stalness: unknown key 'max_stalness'"):
        rft("create", str(bad), "--name", "x", "--owner", "owner")
    assert not Run.objects.exists()


def test_every_cli_error_is_a_message_and_a_nonzero_exit(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"model": "m", "sampling": {"temprature": 1}}')
    result = subprocess.run([sys.executable, "manage.py", "rft", "create", str(bad), "--name", "x", "--owner", "nobody"],
                            cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert "sampling.temprature: unknown key 'temprature'" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("create", "/no/such.yaml", "--name", "x"), "no such file"),
        (("pause", "999"), "no run 999"),
        (("export", "999", "--format", "sft", "--out", "/tmp/x.jsonl"), "no run 999"),
        (("export", "999", "--out", "/tmp/x.jsonl"), "--format is required"),
        (("export", "999", "--format", "ppo", "--out", "/tmp/x.jsonl"), "use one of sft, dpo, grpo, preferences"),
        (("worker", "--queues", "rollout,gpu"), "unknown queue 'gpu'"),
    ],
)
def test_bad_arguments_fail_with_a_message(args: tuple[str, ...], message: str) -> None:
    with pytest.raises(CommandError, match=message):
        rft(*args)


def test_start_pause_resume_and_stop_from_the_cli_are_audited(run: Run, owner: User) -> None:
    assert f"run {run.pk} is running" in rft("start", str(run.pk), "--as", "owner")
    rft("pause", str(run.pk))
    with pytest.raises(CommandError, match="cannot pause a run that is paused"):
        rft("pause", str(run.pk))
    rft("resume", str(run.pk))
    rft("stop", str(run.pk))
    run.refresh_from_db()
    assert run.status == Run.Status.STOPPED
    entries = list(AuditEntry.objects.filter(run=run).order_by("created_at").values_list("action", "actor"))
    assert entries == [("start", owner.pk), ("pause", None), ("resume", None), ("stop", None)]


def test_export_writes_jsonl_and_a_datasets_directory(run: Run, tmp_path: Path) -> None:
    import datasets

    make_experiences(run, groups=2, group_size=4)
    assert "wrote 2 dpo rows from 8" in rft("export", str(run.pk), "--format", "dpo", "--out", str(tmp_path / "dpo.jsonl"))
    assert len((tmp_path / "dpo.jsonl").read_text().splitlines()) == 2
    rft("export", str(run.pk), "--format", "sft", "--hf", "--out", str(tmp_path / "sft"), "--min-reward", "2")
    assert len(datasets.load_from_disk(str(tmp_path / "sft"))) == 4


def test_export_still_reads_the_old_spellings_with_a_note(run: Run, tmp_path: Path) -> None:
    """`--kind F` was `--format F`, and `--format jsonl|hf` the file written (now `--hf`):
    old command lines still work, each old spelling noted on stderr; `--format` wins over `--kind`."""
    import datasets
    from io import StringIO

    make_experiences(run, groups=2, group_size=4)
    out, err = StringIO(), StringIO()
    call_command("rft", "export", str(run.pk), "--kind", "sft", "--format", "hf", "--out", str(tmp_path / "sft"),
                 stdout=out, stderr=err)
    assert "wrote 8 sft rows" in out.getvalue() and len(datasets.load_from_disk(str(tmp_path / "sft"))) == 8
    assert err.getvalue().count("note: ") == 2 and "--kind is deprecated: use --format" in err.getvalue()
    err = StringIO()
    call_command("rft", "export", str(run.pk), "--kind", "sft", "--format", "dpo", "--out", str(tmp_path / "d.jsonl"),
                 stdout=out, stderr=err)
    assert "wrote 2 dpo rows" in out.getvalue() and "--kind is deprecated" in err.getvalue()


def test_the_worker_plan_gives_gpu_queues_a_solo_process_each_and_cpu_queues_a_prefork_pool() -> None:
    plan = worker_plan(queues=["rollout", "train", "reward", "default"], concurrency=3, loglevel="INFO")
    by_queue = {cmd[cmd.index("--queues") + 1]: cmd for cmd in plan}
    assert set(by_queue) == {"rollout", "train", "reward,default"}
    for gpu in ("rollout", "train"):
        cmd = by_queue[gpu]
        assert cmd[cmd.index("--pool") + 1] == "solo" and cmd[cmd.index("--concurrency") + 1] == "1"
    cpu = by_queue["reward,default"]
    assert cpu[cpu.index("--pool") + 1] == "prefork" and cpu[cpu.index("--concurrency") + 1] == "3"
    assert len({cmd[cmd.index("--hostname") + 1] for cmd in plan}) == 3


def test_worker_health_tells_busy_idle_stale_and_stopped_apart(owner: User) -> None:
    now = timezone.now()
    run = make_run(owner=owner)
    worker_heartbeat_record(hostname="rollout@a", queues=["rollout"], pool="solo", concurrency=1, pid=1,
                            active=[{"id": "t1", "name": "workers.explore.explorer.explore_step", "run_id": run.pk, "started_at": None}])
    worker_heartbeat_record(hostname="reward@a", queues=["reward"], pool="prefork", concurrency=2, pid=2, active=[])
    worker_heartbeat_record(hostname="train@b", queues=["train"], pool="solo", concurrency=1, pid=3, active=[])
    WorkerHeartbeat.objects.filter(hostname="train@b").update(last_seen=now - timedelta(minutes=5))
    # Only these three: a worker another test started on this database may have left its
    # "stopped" beat after that test's flush (a module-scoped worker stops after it).
    ours = {"rollout@a", "reward@a", "train@b"}
    states = {w["beat"].hostname: w["state"] for w in workers_health() if w["beat"].hostname in ours}
    assert states == {"rollout@a": "busy", "reward@a": "idle", "train@b": "stale"}
    client = Client()
    client.force_login(owner)
    html = client.get("/runs/workers/").content.decode()
    assert "workers.explore.explorer.explore_step" in html and "state-stale" in html


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_real_worker_started_by_the_cli_reports_its_queues_and_its_shutdown(tmp_path: Path) -> None:
    log = (tmp_path / "worker.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "rft", "worker", "--queues", "reward,default", "--concurrency", "1", "--loglevel", "WARNING"],
        cwd=ROOT, env=child_env(RFT_HEARTBEAT_SECONDS="1"), stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        beat = None
        while time.monotonic() < deadline and beat is None:
            beat = WorkerHeartbeat.objects.filter(hostname__startswith="reward+default@").first()
            time.sleep(0.5)
        assert beat is not None, (tmp_path / "worker.log").read_text()
        assert (beat.queues, beat.pool, beat.concurrency) == (["default", "reward"], "prefork", 1)
        first = beat.last_seen
        deadline = time.monotonic() + 60  # a beat a second; a loaded host delays one by seconds
        while beat.last_seen <= first and time.monotonic() < deadline:
            time.sleep(0.5)
            beat.refresh_from_db()
        assert beat.last_seen > first  # it keeps beating
        # Alive: idle, or busy with a beat of the RFT core's loop (this worker runs Celery beat).
        assert [w["state"] for w in workers_health() if w["beat"].hostname == beat.hostname] in (["idle"], ["busy"])
    finally:
        proc.send_signal(signal.SIGTERM)  # the supervisor forwards it to its workers
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            raise
        finally:
            log.close()
    beat.refresh_from_db()
    assert beat.stopped_at is not None
    assert [w["state"] for w in workers_health() if w["beat"].hostname == beat.hostname] == ["stopped"]
