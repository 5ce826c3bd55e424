"""N concurrent API clients for S seconds against a real uvicorn web tier: status counts,
p50/p99 per endpoint, and the Postgres connections the web processes hold during the load
and after it (issue #33: 50 clients gave 39-45% 500s and 94 connections held on main).

Each configuration gets a fresh uvicorn server (`--processes` workers) on a scratch database
(BENCH_DATABASE_URL's server) and this environment's Redis. The clients are environments:
two in three read their run (`GET /api/v1/runs/<id>`), one in three posts a trajectory
(`POST /api/v1/runs/<id>/trajectories`), each with the key's rate limit counted in Redis.
Measured twice in the same run: with the web process's pool (RFT_DB_POOL_SIZE, `--pool`) and,
as the baseline, with a connection per request (RFT_DB_POOL_SIZE=0).

    python -m bench web_load [--clients 50] [--seconds 60] [--processes 1] [--pool 10]

The last line is the p99 ratio (pool / connection per request), with the load average.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import BENCH_DB, free_port, health_wait, scratch_database

ROOT = Path(__file__).resolve().parent.parent


def load_average() -> str:
    return "load " + " ".join(f"{x:.2f}" for x in os.getloadavg())


class ConnectionWatch:
    """Polls pg_stat_activity for the scratch database (its own session excluded)."""

    def __init__(self, url: str) -> None:
        import psycopg

        self.conn = psycopg.connect(url, autocommit=True)
        self.peak = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def count(self) -> int:
        row = self.conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                                "AND pid <> pg_backend_pid()").fetchone()
        return int(row[0]) if row else 0

    def start(self) -> None:
        self.peak = 0
        self._stop.clear()

        def poll() -> None:
            while not self._stop.is_set():
                self.peak = max(self.peak, self.count())
                time.sleep(0.1)

        self._thread = threading.Thread(target=poll, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def close(self) -> None:
        self.conn.close()


@dataclass
class Result:
    statuses: Counter[str] = field(default_factory=Counter)
    latencies: dict[str, list[float]] = field(default_factory=dict)
    seconds: float = 0.0


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def _trajectory() -> dict[str, Any]:
    return {"trajectories": [{
        "key": f"w-{uuid.uuid4().hex}", "group_id": f"g-{uuid.uuid4().hex[:6]}",
        "messages": [{"role": "user", "content": "Guess the number."}, {"role": "assistant", "content": "<guess>50</guess>"}],
        "token_ids": list(range(24)), "prompt_length": 8, "logprobs": [-0.25] * 16, "reward": 0.5,
    }]}


async def _load(base: str, run_id: int, key: str, *, clients: int, seconds: float) -> Result:
    import logging

    import httpx

    logging.getLogger("httpx").setLevel(logging.WARNING)
    result = Result(latencies={"GET run": [], "POST trajectory": []})
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    stop_at = time.perf_counter() + seconds
    started = time.perf_counter()
    async with httpx.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {key}"}, limits=limits,
                                 timeout=120) as client:

        async def one(worker: int) -> None:
            i = worker
            while time.perf_counter() < stop_at:
                post = i % 3 == 2
                name = "POST trajectory" if post else "GET run"
                t0 = time.perf_counter()
                try:
                    if post:
                        answer = await client.post(f"/api/v1/runs/{run_id}/trajectories", json=_trajectory())
                    else:
                        answer = await client.get(f"/api/v1/runs/{run_id}")
                    status = str(answer.status_code)
                except httpx.HTTPError as exc:
                    status = type(exc).__name__
                result.latencies[name].append(time.perf_counter() - t0)
                result.statuses[status] += 1
                i += 1

        await asyncio.gather(*(one(w) for w in range(clients)))
    result.seconds = time.perf_counter() - started
    return result


def _server(db_url: str, *, processes: int, pool: int, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {**os.environ, "DATABASE_URL": db_url, "DJANGO_SETTINGS_MODULE": "rftweb.settings", "DEBUG": "0",
           "SECRET_KEY": "bench-web-load-secret-key-not-for-production-0123456789", "SECURE_SSL_REDIRECT": "0",
           "RFT_DB_POOL_SIZE": str(pool), "LOG_LEVEL": "WARNING", "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    env.pop("TEST_DATABASE_NAME", None)
    proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "rftweb.asgi:application", "--host", "127.0.0.1",
                             "--port", str(port), "--workers", str(processes), "--no-access-log"],
                            cwd=ROOT, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    if not health_wait(base, seconds=120, alive=lambda: proc.poll() is None):
        _stop(proc)
        raise SystemExit(f"bench: the web server did not start: {log.read_text()[-2000:]}")
    return proc, base


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def _measure(label: str, db_url: str, run_id: int, key: str, args: argparse.Namespace, pool: int,
             watch: ConnectionWatch, logs: Path) -> Result:
    proc, base = _server(db_url, processes=args.processes, pool=pool, log=logs / f"{label.replace(' ', '-').replace('/', '-')}.log")
    try:
        asyncio.run(_load(base, run_id, key, clients=min(4, args.clients), seconds=1.0))  # warm-up
        watch.start()
        result = asyncio.run(_load(base, run_id, key, clients=args.clients, seconds=args.seconds))
        watch.stop()
        ended = time.monotonic()
        after: list[str] = []
        released = None
        while time.monotonic() - ended < args.after:
            held = watch.count()
            if held == 0 and released is None:
                released = time.monotonic() - ended
            for mark in (1.0, 5.0, 10.0):
                if not any(a.startswith(f"{mark:.0f} s:") for a in after) and time.monotonic() - ended >= mark:
                    after.append(f"{mark:.0f} s: {held}")
            time.sleep(0.2)
    finally:
        _stop(proc)
    every = [x for values in result.latencies.values() for x in values]
    total = sum(result.statuses.values())
    errors = sum(n for status, n in result.statuses.items() if not status.startswith("2"))
    five = sum(n for status, n in result.statuses.items() if status.startswith("5"))
    print(f"{label:22s}: {total} requests, {total / result.seconds:6.1f}/s, statuses {dict(sorted(result.statuses.items()))}, "
          f"5xx {five}, non-2xx {errors}; p50 {1000 * statistics.median(every):7.1f} ms, p99 {1000 * _p(every, 0.99):7.1f} ms")
    for name, values in result.latencies.items():
        if values:
            print(f"{'':22s}  {name:15s}: {len(values):6d}  p50 {1000 * statistics.median(values):7.1f} ms  "
                  f"p99 {1000 * _p(values, 0.99):7.1f} ms")
    print(f"{'':22s}  Postgres connections: peak {watch.peak} during, after the end {', '.join(after)}; "
          f"all released {'after %.1f s' % released if released is not None else 'not within %.0f s' % args.after}"
          f"  ({load_average()})")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--processes", type=int, default=1, help="uvicorn worker processes")
    parser.add_argument("--pool", type=int, default=10, help="RFT_DB_POOL_SIZE per process")
    parser.add_argument("--after", type=float, default=12.0, help="seconds to watch connections after the load")
    parser.add_argument("--no-baseline", action="store_true", help="skip the connection-per-request run")
    args = parser.parse_args(argv)

    db_url, drop = scratch_database(BENCH_DB, "web_load")
    os.environ["DATABASE_URL"] = db_url
    os.environ.pop("TEST_DATABASE_NAME", None)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "rftweb.settings")
    logs = Path(tempfile.mkdtemp(prefix="web-load-"))
    watch: ConnectionWatch | None = None
    try:
        import django

        django.setup()
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        from django.contrib.auth.models import User
        from django.db import connections

        from apps.envapi.services import api_key_create
        from apps.runs.services import run_create

        owner = User.objects.create_user("bench-owner")
        run = run_create(name="web load", owner=owner, config={"model": "local/demo", "rewards": []})
        _, key = api_key_create(name="bench", runs=[run], actions=["read", "submit"], rate_limit_per_minute=1_000_000)
        connections.close_all()
        watch = ConnectionWatch(db_url)
        shown = watch.conn.execute("SHOW max_connections").fetchone()
        print(f"web_load: {args.clients} clients x {args.seconds:g} s, {args.processes} uvicorn process(es), "
              f"max_connections {shown[0] if shown else '?'}  ({load_average()})")
        pooled = _measure(f"pool {args.pool}/process", db_url, run.pk, key, args, args.pool, watch, logs)
        if not args.no_baseline:
            baseline = _measure("connection per request", db_url, run.pk, key, args, 0, watch, logs)
            ratio = _p([x for v in pooled.latencies.values() for x in v], 0.99) / _p(
                [x for v in baseline.latencies.values() for x in v], 0.99)
            print(f"web_load p99 ratio (pool / connection per request): {ratio:.2f} ({load_average()})")
        print(f"server logs: {logs}")
    finally:
        if watch is not None:
            watch.close()
        from django.db import connections as conns

        conns.close_all()
        drop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
