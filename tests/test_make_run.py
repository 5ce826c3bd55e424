"""`make run`'s path, command by command as the Makefile runs them: no DATABASE_URL, so the
embedded default's private PostgreSQL under a fresh var folder (the engine every other test
runs on), an in-process broker and channel layer. A newcomer's first page, the runs list,
answers with the demo run; a started demo run explores, trains and publishes versions; the
private server stops with rft_serve."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from apps.cli.management.commands.rft_demo import DEMO_RUN
from bench.common import health_wait
from rftweb import localpg
from tests.servers import embedded_query as query
from tests.servers import embedded_env, free_port

ROOT = Path(__file__).resolve().parent.parent


def logged_in(url: str, username: str, password: str) -> httpx.Client:
    client = httpx.Client(base_url=url, timeout=30)
    form = client.get("/login/")
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form.text)
    assert form.status_code == 200 and token, form.text[:2000]
    done = client.post("/login/", data={"username": username, "password": password, "csrfmiddlewaretoken": token.group(1)})
    assert done.status_code == 302, done.text[:2000]
    return client


def stop_server(server: subprocess.Popen[bytes]) -> None:
    os.killpg(server.pid, signal.SIGTERM)
    try:
        server.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()


@pytest.mark.slow
def test_make_runs_commands_serve_the_runs_list_and_the_demo_loop(embedded_var: Path, demo_model_dir: Path) -> None:
    var = embedded_var
    # The same cached build the worker tests use: rft_demo finds it up to date.
    # The wait windows end on a beat (10 s by default): at 1 s a step no longer waits up to 10 s
    # for the sweep after its 2 s window (about 20 of the test's seconds).
    env = embedded_env(var, RFT_DEMO_MODEL_DIR=str(demo_model_dir), RFT_FEEDBACK_EXPIRE_SECONDS="1")

    def manage(*args: str) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        return proc

    manage("migrate", "--noinput")
    # The demo's people-in-the-loop policy (blend) with a short wait, since nobody rates here.
    demo = manage("rft_demo", "--total-steps", "4", "--feedback-wait", "2").stdout
    assert "demo ready" in demo and "/annotate/ as annotator" in demo
    port = free_port()
    log_path = var / "serve.log"
    log = log_path.open("wb")
    server = subprocess.Popen(
        [sys.executable, "manage.py", "rft_serve", "--port", str(port)], cwd=ROOT, env=env,
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        if not health_wait(url, seconds=120, poll=0.5, alive=lambda: server.poll() is None):
            pytest.fail(log_path.read_text()[-3000:])
        # It says which database it runs on.
        assert f"private PostgreSQL 18" in log_path.read_text() and str(var / "postgres") in log_path.read_text()
        # A newcomer's first page: the runs list, as the demo's owner (issue 45: a 500 on SQLite).
        (run_id,) = query(var, "SELECT id FROM runs_run WHERE name = %s", DEMO_RUN)[0]
        owner = logged_in(url, "owner", "rftweb-demo")
        runs = owner.get("/runs/")
        owner.close()
        assert runs.status_code == 200, runs.text[:3000]
        assert DEMO_RUN in runs.text and f"/runs/{run_id}/" in runs.text
        # The CLI is another process: its start reaches the server's conductor through the
        # database (the resume beat), as a start after a restart would.
        started = manage("rft", "start", str(run_id)).stdout
        # Its twin (rft_demo made it, with people's feedback off) starts with it.
        assert "is running" in started and "(its twin, without people) is running" in started, started
        deadline = time.monotonic() + 240
        status = None
        while time.monotonic() < deadline:
            status, version, trained = query(var, "SELECT status, current_version, train_step FROM runs_run WHERE id = %s",
                                             run_id)[0]
            if status != "running":
                break
            time.sleep(1)
        assert (status, version, trained) == ("finished", 4, 4), log_path.read_text()[-3000:]
        ((experiences, consumed),) = query(
            var, "SELECT count(*), count(*) FILTER (WHERE status = 'consumed') FROM buffer_experience WHERE run_id = %s",
            run_id)
        assert experiences >= 4 * 64 and consumed == 4 * 64
    finally:
        stop_server(server)
        log.close()
    # The private server went with it, and no query of a thread still at work on the way out
    # started it again.
    served = log_path.read_text()
    assert localpg.running_pid(localpg.Cluster(data=var / "postgres")) is None, served[-3000:]
    assert "stopped the private PostgreSQL" in served, served[-3000:]
