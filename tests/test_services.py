"""scripts/services.py, `make test`'s set-up: where no PostgreSQL or Redis answers at
DATABASE_URL / REDIS_URL it starts one of each on a spare port for the command and stops them
after; where they answer, it hands the command the same URLs and starts nothing. "None
answers" is a spare port here: the machine's shared PostgreSQL and Redis are never stopped."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from rftweb import localpg
from tests.servers import free_port

ROOT = Path(__file__).resolve().parent.parent

# The command under services.py: what it was handed, and whether both answer a query.
_PROBE = """
import json, os, psycopg, redis
from urllib.parse import urlsplit
url = urlsplit(os.environ["DATABASE_URL"])
with psycopg.connect(url._replace(scheme="postgresql").geturl()) as db:
    database = db.execute("SELECT current_database()").fetchone()[0]
# A URL without a user name (the tests' bench databases) connects as the OS user.
with psycopg.connect(host=url.hostname, port=url.port or 5432, dbname=database) as db:
    db.execute("SELECT 1")
print(json.dumps({"database_url": os.environ["DATABASE_URL"], "redis_url": os.environ["REDIS_URL"],
                  "database": database, "redis": redis.Redis.from_url(os.environ["REDIS_URL"]).ping()}))
raise SystemExit(3)
"""


@pytest.fixture
def services_dir() -> Iterator[Path]:
    # Outside pytest's tmp_path, as tests/servers.py's embedded_var says why.
    folder = Path(tempfile.mkdtemp(prefix="rftweb-services-"))
    try:
        with localpg.stopped_after(localpg.Cluster(data=folder / "postgres")):
            yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def services(folder: Path, **urls: str) -> tuple[subprocess.CompletedProcess[str], dict[str, object]]:
    env = {**os.environ, **urls}
    proc = subprocess.run([sys.executable, "scripts/services.py", "--dir", str(folder), "--", sys.executable, "-c", _PROBE],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    lines = proc.stdout.strip().splitlines()
    assert lines, proc.stderr[-3000:]
    return proc, json.loads(lines[-1])


def answers(url: str) -> bool:
    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname or "localhost", parts.port or 0), timeout=2):
            return True
    except OSError:
        return False


@pytest.mark.slow
def test_where_none_answers_it_starts_postgres_and_redis_on_spare_ports_and_stops_them_after(services_dir: Path) -> None:
    nothing_pg, nothing_redis = f"postgres://localhost:{free_port()}/suite", f"redis://localhost:{free_port()}/5"
    proc, seen = services(services_dir, DATABASE_URL=nothing_pg, REDIS_URL=nothing_redis)
    # The command's exit status is the script's.
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert seen["database"] == "suite" and seen["redis"] is True
    started_pg, started_redis = str(seen["database_url"]), str(seen["redis_url"])
    assert started_pg != nothing_pg and started_redis.endswith("/5") and started_redis != nothing_redis
    assert "no PostgreSQL answered" in proc.stderr and "no Redis answered" in proc.stderr
    # Both gone once the command ended; the data stays for the next run.
    assert not answers(started_pg) and not answers(started_redis)
    assert localpg.running_pid(localpg.Cluster(data=services_dir / "postgres")) is None
    assert (services_dir / "postgres" / "PG_VERSION").exists()


def test_where_both_answer_it_hands_the_command_the_same_urls_and_starts_nothing(services_dir: Path) -> None:
    # The suite's own services (the shared ones, or those `make test` started).
    database_url, redis_url = os.environ["DATABASE_URL"], os.environ["REDIS_URL"]
    proc, seen = services(services_dir, DATABASE_URL=database_url, REDIS_URL=redis_url)
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert (seen["database_url"], seen["redis_url"]) == (database_url, redis_url)
    assert "started" not in proc.stderr
    assert not (services_dir / "postgres").exists() and not (services_dir / "redis").exists()
