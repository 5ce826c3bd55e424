"""The embedded default (no DATABASE_URL, no REDIS_URL): a private PostgreSQL under the var
folder, started by the first command that needs it, kept across rft_serve's restarts with
its data, stopped when rft_serve exits, and started again after a crash (rftweb/localpg)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psycopg
import pytest

from rftweb import localpg
from tests.servers import free_port
from tests.servers import embedded_env
from tests.servers import embedded_query as query

ROOT = Path(__file__).resolve().parent.parent


def serve(env: dict[str, str], log: Path) -> tuple[subprocess.Popen[bytes], str]:
    """`manage.py rft_serve` on a spare port, once it says it is ready."""
    port = free_port()
    before = log.read_text(errors="replace").count(" ready.") if log.exists() else 0
    server = subprocess.Popen([sys.executable, "manage.py", "rft_serve", "--port", str(port)], cwd=ROOT, env=env,
                              stdout=log.open("ab"), stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and log.read_text(errors="replace").count(" ready.") <= before:
        assert server.poll() is None, log.read_text()[-3000:]
        time.sleep(0.2)
    return server, f"http://127.0.0.1:{port}"


@pytest.mark.slow
def test_the_private_postgres_outlives_a_killed_rft_serve_and_stops_with_rft_serve(embedded_var: Path) -> None:
    var = embedded_var
    """A process manager's SIGTERM (or Ctrl+C) ends the embedded server within
    RFT_SERVE_STOP_SECONDS and a little (Celery's warm shutdown alone took 7-17 s), the
    private PostgreSQL with it; a kill -9 leaves it running for the next rft_serve."""
    env = embedded_env(var, RFT_SERVE_STOP_SECONDS="1")
    cluster = localpg.Cluster(data=var / "postgres")
    subprocess.run([sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=ROOT, env=env, check=True,
                   timeout=300)
    # migrate left it running for the server it precedes.
    first_pid = localpg.running_pid(cluster)
    assert first_pid is not None
    query(var, "INSERT INTO auth_user (username, password, is_superuser, first_name, last_name, email, is_staff, "
               "is_active, date_joined) VALUES ('kept', '!', false, '', '', '', false, true, now())")
    log = var / "serve.log"
    server, url = serve(env, log)
    try:
        assert localpg.running_pid(cluster) == first_pid  # found running, not started twice
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()
        # pg_ctl puts the server in a session of its own: a killed rft_serve's group leaves it.
        assert localpg.running_pid(cluster) == first_pid
        server, url = serve(env, log)
        ready = httpx.get(f"{url}/ready/", timeout=10)
        assert ready.status_code == 200 and json.loads(ready.text)["database"] == "ok", ready.text
        assert localpg.running_pid(cluster) == first_pid
        sent = time.monotonic()
        server.send_signal(signal.SIGTERM)
        code = server.wait(timeout=30)
        took = time.monotonic() - sent
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
    assert code == 0, log.read_text()[-3000:]
    # The grace (1 s), the PostgreSQL's fast stop and the exit itself on a loaded 2-core host.
    assert took < 8, f"{took:.1f} s: {log.read_text()[-2000:]}"
    assert localpg.running_pid(cluster) is None and "stopped the private PostgreSQL" in log.read_text()
    # The next command starts it again, the data kept.
    shell = subprocess.run([sys.executable, "manage.py", "shell", "-c",
                            "from django.contrib.auth.models import User; print(User.objects.filter(username='kept').count())"],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert shell.stdout.split()[-1:] == ["1"], shell.stdout + shell.stderr[-2000:]


def test_a_crashed_servers_leftovers_do_not_stop_the_next_start(embedded_var: Path) -> None:
    var = embedded_var
    """kill -9 of the postmaster leaves its pid and socket lock files, and a pid file may name
    a process that is alive but another (a pid reused after a reboot): both start again."""
    with localpg.stopped_after(localpg.Cluster(data=var / "postgres")) as cluster:
        assert localpg.ensure_running(cluster, database="kept") is True
        assert localpg.ensure_running(cluster, database="kept") is False  # running: nothing to do
        os.kill(localpg.running_pid(cluster) or 0, signal.SIGKILL)
        # The kill is delivered, not yet done: a crashed server is one whose process is gone.
        deadline = time.monotonic() + 60
        while localpg.running_pid(cluster) is not None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert localpg.running_pid(cluster) is None, "the killed postmaster did not go"
        assert localpg.ensure_running(cluster, database="kept") is True
        localpg.stop(cluster)
        # A pid file naming this test's own (live, not postgres) process.
        (cluster.data / "postmaster.pid").write_text(f"{os.getpid()}\n{cluster.data}\n0\n5432\n\n\n0 0\nready\n")
        assert localpg.running_pid(cluster) is None
        assert localpg.ensure_running(cluster, database="kept") is True
        with psycopg.connect(host=str(cluster.socket_dir), user="postgres", dbname="kept") as db:
            assert db.execute("SELECT 1").fetchone() == (1,)


def test_a_data_folder_too_deep_for_a_unix_socket_gets_a_short_private_socket_folder(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 60) / "postgres"
    assert len(str(deep / ".s.PGSQL.5432")) > 107
    found = localpg.socket_dir(deep)
    assert len(str(found / ".s.PGSQL.5432")) <= 107 and found == localpg.socket_dir(deep)
    assert localpg.socket_dir(tmp_path / "postgres") == tmp_path / "postgres"


def test_the_embedded_default_uses_the_private_postgres_and_in_process_services(tmp_path: Path) -> None:
    probe = ("import django; from django.conf import settings as s; d = s.DATABASES['default']; "
             "print(d['ENGINE'], d['HOST'], d['NAME'], s.CHANNEL_LAYERS['default']['BACKEND'], s.CELERY_BROKER_URL)")
    env = embedded_env(tmp_path, DJANGO_SETTINGS_MODULE="rftweb.settings", PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.stdout.split() == ["rftweb.localpg", str(tmp_path / "postgres"), "rftweb",
                                   "rftweb.layers.EmbeddedChannelLayer", "memory://"], proc.stderr[-2000:]
    # Reading the settings starts nothing.
    assert not (tmp_path / "postgres").exists()
