"""Trajectory submissions per second through the environment API vs a minimal Django JSON view.

Both run on one daphne server in this process's run, against a scratch Postgres database
(DATABASE_URL's server, else the embedded default's private one in a temporary var folder):
the API (`POST /api/v1/runs/<id>/trajectories`, with key, scope, rate limit, validation,
idempotent write and live event) against a plain view that stores the same row with the ORM
and nothing else. 16 concurrent clients; the two
are measured in alternating rounds so drift on a shared machine hits both alike.

    python -m bench.env_api [--seconds 6] [--rounds 2] [--concurrency 16]

Target: ratio (API / baseline submissions per second) >= 0.5. The last line is the ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench.common import free_port, health_wait, processes_stop, scratch_database

ROOT = Path(__file__).resolve().parent.parent


def _scratch_database() -> tuple[dict[str, str], Any]:
    """Env for a fresh database, and a cleanup callable."""
    url = os.environ.get("DATABASE_URL")
    if not url:
        # The embedded default's private PostgreSQL, in a var folder of the bench's own.
        from rftweb import localpg

        var = Path(tempfile.mkdtemp())
        return {"DATABASE_URL": "", "RFT_VAR_DIR": str(var)}, lambda: localpg.stop(localpg.Cluster(data=var / "postgres"))
    database_url, drop = scratch_database(url, "bench_envapi")
    return {"DATABASE_URL": database_url}, drop


def _trajectory(i: int) -> dict[str, Any]:
    return {"trajectories": [{
        "key": f"b-{uuid.uuid4().hex}", "group_id": f"g{i // 4}",
        "messages": [{"role": "system", "content": "Guess the number from 1 to 100."},
                     {"role": "assistant", "content": "<guess>50</guess>"},
                     {"role": "user", "content": "lower"},
                     {"role": "assistant", "content": "<guess>25</guess>"}],
        "token_ids": list(range(48)), "prompt_length": 16, "logprobs": [-0.25] * 32,
        "reward": 0.8, "reward_parts": {"solved": 1.0, "speed": 0.5},
    }]}


async def _load(url: str, headers: dict[str, str], *, seconds: float, concurrency: int) -> tuple[int, list[float], int]:
    import logging

    import httpx

    logging.getLogger("httpx").setLevel(logging.WARNING)
    latencies: list[float] = []
    errors = 0
    stop_at = time.perf_counter() + seconds
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(headers=headers, limits=limits, timeout=30) as client:

        async def one(worker: int) -> None:
            nonlocal errors
            i = worker
            while time.perf_counter() < stop_at:
                body = _trajectory(i)
                t0 = time.perf_counter()
                response = await client.post(url, json=body)
                latencies.append(time.perf_counter() - t0)
                if response.status_code != 200:
                    errors += 1
                    if errors <= 3:
                        print(f"bench: {url} answered {response.status_code}: {response.text[:300]}", file=sys.stderr)
                i += concurrency

        await asyncio.gather(*(one(w) for w in range(concurrency)))
    # Only stored submissions count: a fast failure (e.g. the database refusing a connection) is not throughput.
    return len(latencies) - errors, latencies, errors


def _p(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=6.0, help="per round and side")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args(argv)

    db_env, drop = _scratch_database()
    os.environ.update(db_env)
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.env_api_settings"
    env = {**os.environ, "LOG_LEVEL": "WARNING", "PYTHONUNBUFFERED": "1"}
    env.pop("TEST_DATABASE_NAME", None)
    server: subprocess.Popen[bytes] | None = None
    try:
        import django

        django.setup()
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        from django.contrib.auth.models import User

        from apps.envapi.services import api_key_create
        from apps.runs.services import run_create

        owner = User.objects.create_user("bench-owner")
        run = run_create(name="bench", owner=owner, config={"model": "local/demo", "rewards": []})
        _, raw = api_key_create(name="bench", runs=[run], actions=["submit"], rate_limit_per_minute=1_000_000)

        server_log = Path(tempfile.mkdtemp()) / "daphne.log"
        port = free_port()
        server = subprocess.Popen(
            # DJANGO_SETTINGS_MODULE (bench settings: project URLs + the baseline view) rides in env.
            [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "rftweb.asgi:application"],
            cwd=ROOT, env=env, stdout=server_log.open("wb"), stderr=subprocess.STDOUT,
        )
        base = f"http://127.0.0.1:{port}"
        if not health_wait(base, seconds=60):
            raise SystemExit("bench: the server did not start")

        api_url = f"{base}/api/v1/runs/{run.pk}/trajectories"
        baseline_url = f"{base}/bench/baseline/{run.pk}/"
        auth = {"Authorization": f"Bearer {raw}"}
        sides = {"api": (api_url, auth), "baseline": (baseline_url, {})}
        results: dict[str, dict[str, Any]] = {name: {"n": 0, "t": 0.0, "lat": [], "err": 0} for name in sides}
        for name, (url, headers) in sides.items():  # warm-up: connections, caches, first queries
            asyncio.run(_load(url, headers, seconds=1.0, concurrency=args.concurrency))
        for _ in range(args.rounds):
            for name, (url, headers) in sides.items():
                t0 = time.perf_counter()
                n, lat, err = asyncio.run(_load(url, headers, seconds=args.seconds, concurrency=args.concurrency))
                r = results[name]
                r["n"] += n
                r["t"] += time.perf_counter() - t0
                r["lat"] += lat
                r["err"] += err
        for name, r in results.items():
            rate = r["n"] / r["t"]
            r["rate"] = rate
            print(f"{name:8s}: {rate:7.1f} submissions/s  p50 {1000 * statistics.median(r['lat']):6.1f} ms  "
                  f"p99 {1000 * _p(r['lat'], 0.99):6.1f} ms  ({r['n']} stored, {r['err']} failed, "
                  f"concurrency {args.concurrency})")
        if results["api"]["err"] or results["baseline"]["err"]:
            print(f"bench: some requests failed; the numbers above count them. Server log: {server_log}", file=sys.stderr)
        print(f"p99 ratio (baseline/API, higher is better): {_p(results['baseline']['lat'], 0.99) / _p(results['api']['lat'], 0.99):.2f}")
        print(f"ratio (API/baseline submissions/s, target >= 0.5): {results['api']['rate'] / results['baseline']['rate']:.2f}")
    finally:
        if server is not None:
            processes_stop([server])
        from django.db import connections

        connections.close_all()
        drop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
