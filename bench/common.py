"""Shared set-up for benches: a dedicated Postgres database, migrated, and Django ready."""

from __future__ import annotations

import contextlib
import atexit
import os
import re
import socket
import statistics
import sys
import time
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

if TYPE_CHECKING:
    import subprocess

ROOT = Path(__file__).resolve().parent.parent
# The server and the name each bench's database starts from (the tests point it beside theirs).
BENCH_DB_BASE = os.environ.get("BENCH_DATABASE_URL", "postgres://localhost:5432/rftweb_bench")


def bench_database_url(base: str, *, bench: str, pid: int) -> str:
    """The database of one bench process: `base`'s name suffixed by the bench's name and the
    process id, at most Postgres's 63 bytes. Two benches at once each get their own, so
    neither races the other's CREATE DATABASE or migrate, and neither sees (or stops, or
    expires the windows of) the other's runs."""
    parts = urlsplit(base)
    tail = f"_{re.sub(r'[^a-z0-9_]', '_', bench.lower())[:30] or 'bench'}_{pid}"
    name = (parts.path.lstrip("/") or "rftweb_bench")[:63 - len(tail)] + tail
    return urlunsplit(parts._replace(path=f"/{name}"))


# Set by the process that made its database (`database_own`), for the processes it starts
# (spawned claimers, a migrating child, arms run as subprocesses): they work in the same one.
OWN_DATABASE_ENV = "BENCH_OWN_DATABASE_URL"
# This process's database (made by `database_own`, dropped when the process ends unless
# BENCH_KEEP_DATABASE=1): the bench's module name and the pid, as `python -m bench.NAME` and
# `python -m bench NAME` both set argv[0] to the module's file; its parent bench's, if any.
BENCH_DB = os.environ.get(OWN_DATABASE_ENV) or bench_database_url(
    BENCH_DB_BASE, bench=Path(sys.argv[0]).stem if sys.argv and sys.argv[0] else "bench", pid=os.getpid())
# Where benches find (or build) the demo model; the smoke tests point it at the tests' build.
DEMO_DIR = Path(os.environ.get("BENCH_DEMO_DIR", str(ROOT / ".cache" / "demo-model")))
# Debian's chromium, as the browser tests and benches drive it (Playwright): its headless shell
# (package chromium-headless-shell: the same build's Blink and V8 without the browser's UI, what
# Playwright itself runs for a headless page) where it is installed, else the whole browser. On
# this 2-core host the shell took a third of the browser's CPU for the same contexts and pages
# (30 contexts of 3 page loads at two widths: 10.5 against 34.4 CPU-s, 2026-11-27), and
# Chromium had been the suite's largest consumer of CPU. A person watching (`--headed`) gets
# the whole browser.
CHROMIUM_BROWSER = "/usr/bin/chromium"
CHROMIUM_SHELL = "/usr/bin/chromium-headless-shell"
CHROMIUM = CHROMIUM_SHELL if Path(CHROMIUM_SHELL).exists() else CHROMIUM_BROWSER
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def demo_model_identity(folder: Path) -> str:
    """Which build of the demo model a bench read: its weights' hash and what it was built
    with, from the build's manifest, so figures from two machines can be told apart by build
    (workers/models/build.py pins the numerics; a library version or recipe moves the bits)."""
    from workers.models.build import manifest_read
    from workers.models.demo import MANIFEST

    manifest = manifest_read(folder, name=MANIFEST)
    if manifest is None:
        return f"the demo model at {folder}: no build manifest"
    versions = ", ".join(f"{k} {v}" for k, v in sorted(manifest.get("versions", {}).items()))
    recipe = manifest.get("settings", {}).get("recipe", "?")
    weights = manifest.get("files", {}).get("model.safetensors", "?")[:12]
    return f"the demo model: recipe {recipe}, weights sha256 {weights}, built with {versions}"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (the OS picks it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def compose_web_command(*, port: int, workers: int, host: str = "127.0.0.1") -> list[str]:
    """docker-compose.yml's web command (uvicorn and every flag it is given there) for this
    machine: this Python's uvicorn, on `host`:`port`, with `workers` processes."""
    import yaml

    command = [str(x) for x in yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]["web"]["command"]]
    if command[0] != "uvicorn":
        raise ValueError(f"docker-compose.yml's web service runs {command[0]!r}, not uvicorn")
    for flag, value in (("--host", host), ("--port", str(port)), ("--workers", str(workers))):
        command[command.index(flag) + 1] = value
    return [sys.executable, "-m", *command]


def health_wait(url: str, *, seconds: float, poll: float = 0.2, alive: Callable[[], bool] = lambda: True) -> bool:
    """Whether the server at `url` answered /health/ with 200 within `seconds`; False as soon
    as `alive()` says its process is gone."""
    import httpx

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and alive():
        try:
            if httpx.get(f"{url}/health/", timeout=1).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(poll)
    return False


@contextmanager
def own_conductor() -> Iterator[None]:
    """This process is the run's conductor and both its workers (a bench's loop calls explore
    and train itself): what a step would send to the Celery queues after it ends (the next
    explore or train step) is what the loop does itself. Left in, those messages sat in a
    broker nobody reads, and the loop's recovery sent them again every
    RFT_DISPATCH_RESEND_SECONDS, with a warning each time ("explore step 2 sent again")."""
    from unittest import mock

    with mock.patch("apps.control.conductor.run_advance_after_step", lambda **_: None):
        yield


def wait_windows_end(*, run_ids: Collection[int], now: datetime) -> tuple[int, int]:
    """End the wait windows of the runs `run_ids` (the ones this bench made) that have run out
    at `now`, as the product's beat (`feedback_wait_expire`) does: (groups made trainable,
    groups dropped). Other runs' windows are left alone, whatever `now` says."""
    from apps.feedback.handout.expiry import feedback_wait_expire

    result = feedback_wait_expire(now=now, run_ids=run_ids)
    return result.groups_ready, result.groups_dropped


def run_wait_ended(run: Any, *, seconds: float, poll: float = 0.5) -> None:
    """Wait until `run` (a Run, read again every `poll` seconds) has finished, stopped or
    failed, for at most `seconds`; the caller asserts which."""
    import time

    from apps.runs.models import Run

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        run.refresh_from_db()
        if run.status in (Run.Status.FINISHED, Run.Status.STOPPED, Run.Status.FAILED):
            return
        time.sleep(poll)


def bench_worker(name: str, queues: str, include: list[str], *, env: dict[str, str], logs: Path,
                 beat: bool = False) -> subprocess.Popen[bytes]:
    """A solo-pool Celery worker for `queues` (with Celery beat in it when `beat`), its output
    in `logs`/<name>.log."""
    import subprocess

    cmd = [sys.executable, "-m", "celery", "-A", "rftweb", "worker", "-P", "solo", "-Q", queues, "-n", f"{name}@%h",
           "--without-heartbeat", "--without-gossip", "--without-mingle", "-l", "WARNING"]
    for module in include:
        cmd += ["-I", module]
    if beat:
        cmd += ["-B", "-s", str(logs / f"{name}-beat-schedule")]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=(logs / f"{name}.log").open("ab"), stderr=subprocess.STDOUT)


def exit_on_sigterm() -> None:
    """A SIGTERM ends the bench as an error would, through its `finally` blocks and `with`
    exits: the servers, workers and private databases it started stop and its folders go.
    Python's default SIGTERM ends the process without them (a killed demo_teach left its
    PostgreSQL running and 474 MB in /tmp)."""
    import signal

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))


def processes_stop(procs: list[Any], *, timeout: float = 30, group: bool = False) -> None:
    """SIGTERM to every process (they shut down side by side), then, to any that has not
    exited within `timeout`, SIGABRT and SIGKILL, with a line on stderr naming it. `group`:
    each process leads a process group of its own, and the whole group gets the signals.

    A slow stop is reported, not raised: how long a server takes to shut down is not what a
    bench measures, and on a loaded host (`make test-bench` runs two benches side by side) 10 s
    was once too short for daphne (CI, 2026-11-27). A Python process started with
    PYTHONFAULTHANDLER=1 (`server_env`) writes every thread's stack to its stderr on the
    SIGABRT, so its log says where it was."""
    import signal
    import subprocess

    def send(proc: subprocess.Popen[Any], sig: signal.Signals) -> None:
        # A group's members may outlive its leader: the group is signalled whatever the leader is doing.
        with contextlib.suppress(ProcessLookupError):
            if group:
                os.killpg(proc.pid, sig)
            elif proc.poll() is None:
                proc.send_signal(sig)

    for proc in procs:
        send(proc, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for proc in procs:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            print(f"bench: {' '.join(map(str, proc.args))[:200]} had not exited {timeout:g} s after SIGTERM: "
                  "stopping it with SIGABRT (SIGKILL if that fails)", file=sys.stderr)
            send(proc, signal.SIGABRT)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                send(proc, signal.SIGKILL)
                proc.wait()
        if group:
            send(proc, signal.SIGKILL)  # what of the group outlived its leader (it had its SIGTERM)


def server_env(env: dict[str, str]) -> dict[str, str]:
    """`env` for a server a bench starts: faulthandler on, so that the SIGABRT of
    `processes_stop` leaves the stacks of a server that would not stop in its log."""
    return {**env, "PYTHONFAULTHANDLER": "1"}


def setup_django(*, database_url: str | None = None, migrate: bool = True) -> None:
    """Point Django at the bench database and migrate it. By default that is this process's
    own (`BENCH_DB`): made fresh (a copy of BENCH_DATABASE_TEMPLATE where the tests name one)
    and dropped when the process ends, unless BENCH_KEEP_DATABASE=1 keeps it to look at. A
    `database_url` given is used as it is (created when missing, never dropped)."""
    sys.path.insert(0, str(ROOT))
    own = database_url is None
    database_url = database_own() if database_url is None else database_url
    os.environ["DATABASE_URL"] = database_url
    os.environ.setdefault("REDIS_URL", "redis://localhost:6379/15")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "rftweb.settings")
    # A database named by the caller, or this bench's own shared with the processes it
    # started, may be set up by two processes at once: its creation and migration take turns
    # (an advisory lock on the server), so neither meets "relation already exists".
    with database_setup_lock(database_url):
        if not own:
            _ensure_database(database_url)
        import django

        django.setup()
        if migrate:
            from django.core.management import call_command

            call_command("migrate", verbosity=0, interactive=False)


def database_own() -> str:
    """This bench's own database (`BENCH_DB`), made fresh at the first call in the process
    that owns it and dropped when that process ends (unless BENCH_KEEP_DATABASE=1); the
    processes it starts find it in their environment and use it as it is."""
    if os.environ.get(OWN_DATABASE_ENV) == BENCH_DB:
        return BENCH_DB
    drop = database_fresh(BENCH_DB)
    if os.environ.get("BENCH_KEEP_DATABASE") == "1":
        print(f"bench: database {urlsplit(BENCH_DB).path.lstrip('/')} kept (BENCH_KEEP_DATABASE=1)", file=sys.stderr)
    else:
        atexit.register(drop)
    os.environ[OWN_DATABASE_ENV] = BENCH_DB
    return BENCH_DB


@contextmanager
def database_setup_lock(url: str) -> Iterator[None]:
    """Hold a Postgres advisory lock named by `url`'s database (on the server's `postgres`
    database) while the block runs: two processes setting one database up take turns."""
    import psycopg

    parts = urlsplit(url)
    with psycopg.connect(urlunsplit(parts._replace(path="/postgres")), autocommit=True) as conn:
        conn.execute("SELECT pg_advisory_lock(hashtext(%s))", (f"bench-setup:{parts.path}",))
        try:
            yield
        finally:
            conn.execute("SELECT pg_advisory_unlock(hashtext(%s))", (f"bench-setup:{parts.path}",))


def _ensure_database(url: str) -> None:
    import psycopg

    parts = urlsplit(url)
    name = parts.path.lstrip("/")
    admin = urlunsplit(parts._replace(path="/postgres"))
    with psycopg.connect(admin, autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')


def scratch_database(url: str, suffix: str) -> tuple[str, Callable[[], None]]:
    """A fresh database `<name>_<suffix>` on `url`'s server: its URL, and a callable that drops it.
    Where BENCH_DATABASE_TEMPLATE names a migrated database (the smoke tests' template,
    tests/databases.py), it is a copy of that one: migrating it is then a no-op."""
    parts = urlsplit(url)
    scratch = urlunsplit(parts._replace(path=f"/{(parts.path.lstrip('/') or 'rftweb')}_{suffix}"))
    return scratch, database_fresh(scratch)


def database_fresh(url: str) -> Callable[[], None]:
    """Make `url`'s database afresh (dropped first if a crashed process left it; a copy of
    BENCH_DATABASE_TEMPLATE where that is set); returns the callable that drops it."""
    import psycopg

    parts = urlsplit(url)
    name = parts.path.lstrip("/")
    admin = urlunsplit(parts._replace(path="/postgres"))

    def drop() -> None:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    drop()
    with psycopg.connect(admin, autocommit=True) as conn:
        template = os.environ.get("BENCH_DATABASE_TEMPLATE")
        conn.execute(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else ""))
    return drop


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")
