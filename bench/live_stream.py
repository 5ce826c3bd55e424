"""Live stream latency: events published by a worker process reach N browser websockets.

    python -m bench.live_stream [--clients 50] [--rate 200] [--seconds 5]

A worker process publishes `experience.created` events through `event_publish_async` at a
fixed rate; a real daphne server fans them out to N authenticated websocket clients of the
run; each client timestamps arrival. Three phases, in the same run: the default Redis
channel layer (channels_redis.core, one list entry per group member) with 1 client and with
N, then the pub/sub layer (RFT_CHANNEL_LAYER=pubsub: one message per process, fanned out in
the process) with N. Target: p99 < 100 ms at 50 clients and 200 events/s. The last line
prints the p99 ratio pubsub / core at N clients.

Needs DATABASE_URL (Postgres) and REDIS_URL; makes and drops its own database.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TARGET_P99_MS = 100.0


def _setup_django() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "rftweb.settings")
    import django

    django.setup()


async def _publish(run_id: int, rate: float, seconds: float) -> None:
    from apps.runs.events import event_publish_async

    count = int(rate * seconds)
    start = time.perf_counter()
    for seq in range(count):
        # Paced against the schedule, not by sleeping a fixed gap, so slow sends don't lower the rate.
        delay = start + seq / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        await event_publish_async(run_id=run_id, type="experience.created",
                                  payload={"ids": [seq], "seq": seq, "t": time.time()})


def publisher_main(args: argparse.Namespace) -> None:
    _setup_django()
    asyncio.run(_publish(args.run_id, args.rate, args.seconds))


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    k = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[k]


async def _phase(*, url: str, origin: str, cookie: str, run_id: int, clients: int, rate: float, seconds: float,
                 env: dict[str, str]) -> dict[str, Any]:
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed

    conns = []
    for _ in range(clients):
        conns.append(await connect(url, additional_headers={"Origin": origin, "Cookie": cookie}, open_timeout=30,
                                   max_queue=None))
    expected = int(rate * seconds)
    latencies: list[float] = []
    received = [0] * clients

    closed: list[str] = []

    async def reader(i: int, ws: Any) -> None:
        try:
            await _read(i, ws)
        except ConnectionClosed as exc:  # counted as lost below; the reason is printed
            closed.append(str(exc))

    async def _read(i: int, ws: Any) -> None:
        async for raw in ws:
            now = time.time()
            msg = json.loads(raw)
            if msg.get("type") != "experience.created":
                continue
            latencies.append((now - msg["payload"]["t"]) * 1000.0)
            received[i] += 1
            if received[i] >= expected:
                return

    readers = [asyncio.create_task(reader(i, ws)) for i, ws in enumerate(conns)]
    await asyncio.sleep(0.5)  # let every subscription settle in the group
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.live_stream", "--publish", "--run-id", str(run_id), "--rate", str(rate),
        "--seconds", str(seconds), cwd=ROOT, env=env,
    )
    await proc.wait()
    try:
        await asyncio.wait_for(asyncio.gather(*readers), timeout=10)
    except TimeoutError:
        for t in readers:
            t.cancel()
    for ws in conns:
        await ws.close()
    total = sum(received)
    return {
        "clients": clients, "events": expected, "delivered": total, "lost": expected * clients - total,
        "p50": _percentile(latencies, 50), "p99": _percentile(latencies, 99), "max": max(latencies, default=float("nan")),
        "mean": statistics.fmean(latencies) if latencies else float("nan"),
        "closed": sorted(set(closed)),
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--rate", type=float, default=200.0, help="events per second")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--publish", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--run-id", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.publish:
        publisher_main(args)
        return 0
    if args.clients < 1 or args.rate <= 0 or args.seconds <= 0:
        parser.error("clients, rate and seconds must be positive")
    if not os.environ.get("DATABASE_URL", "").startswith("postgres") or not os.environ.get("REDIS_URL"):
        print("bench.live_stream: needs DATABASE_URL (postgres://...) and REDIS_URL (redis://...)", file=sys.stderr)
        return 2
    # A database of its own, so the bench never touches real runs or a test session's database.
    os.environ["TEST_DATABASE_NAME"] = f"bench_live_stream_{os.getpid()}"
    os.environ.setdefault("CHANNELS_PREFIX", f"bench{os.getpid()}")
    _setup_django()
    from django.contrib.auth.models import User
    from django.contrib.sessions.backends.db import SessionStore
    from django.db import connection

    from apps.runs.services import run_create

    old_name = connection.settings_dict["NAME"]
    db_name = connection.creation.create_test_db(verbosity=0, autoclobber=True, serialize=False)
    server = None
    try:
        user = User.objects.create_user(username="bench", password="bench-only")
        run = run_create(name="bench", owner=user, config={"model": "local/bench", "rewards": []})
        session = SessionStore()
        session["_auth_user_id"] = str(user.pk)
        session["_auth_user_backend"] = "django.contrib.auth.backends.ModelBackend"
        session["_auth_user_hash"] = user.get_session_auth_hash()
        session.create()
        db = connection.settings_dict
        env = dict(os.environ)
        env["DATABASE_URL"] = f"postgres://{db.get('USER') or ''}@{db.get('HOST') or 'localhost'}:{db.get('PORT') or 5432}/{db_name}"
        env.pop("TEST_DATABASE_NAME", None)
        results: list[tuple[str, dict[str, Any]]] = []
        log_path = Path(os.environ.get("BENCH_LOG", "/dev/null"))
        log = open(log_path, "a")
        for layer, clients in (("core", 1), ("core", args.clients), ("pubsub", args.clients)):
            layer_env = {**env, "RFT_CHANNEL_LAYER": layer}
            port = _free_port()
            server = subprocess.Popen(
                [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "rftweb.asgi:application"],
                cwd=ROOT, env=layer_env, stdout=subprocess.DEVNULL, stderr=log,
            )
            origin = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 60
            while True:
                try:
                    urllib.request.urlopen(origin + "/health/", timeout=2)
                    break
                except OSError:
                    if server.poll() is not None or time.monotonic() > deadline:
                        print("bench.live_stream: the server did not start", file=sys.stderr)
                        return 1
                    time.sleep(0.2)
            result = asyncio.run(_phase(
                url=f"ws://127.0.0.1:{port}/ws/runs/{run.pk}/", origin=origin, cookie=f"sessionid={session.session_key}",
                run_id=run.pk, clients=clients, rate=args.rate, seconds=args.seconds, env=layer_env,
            ))
            results.append((layer, result))
            server.terminate()
            server.wait(timeout=10)
            server = None
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=10)
        connection.close()
        connection.creation.destroy_test_db(old_name, verbosity=0)

    for layer, r in results:
        print(f"{layer:7s} {r['clients']:4d} clients, {r['events']} events at {args.rate:g}/s: "
              f"p50 {r['p50']:.1f} ms, p99 {r['p99']:.1f} ms, max {r['max']:.1f} ms, "
              f"delivered {r['delivered']}, lost {r['lost']}"
              + (f", connections closed: {'; '.join(r['closed'])}" if r["closed"] else ""))
    core, pubsub = results[1][1], results[2][1]

    def verdict(r: dict[str, Any]) -> str:
        return "met" if r["p99"] < TARGET_P99_MS and r["lost"] == 0 else "MISSED"

    print(f"live_stream: {args.clients} clients at {args.rate:g} events/s: p50/p99 core {core['p50']:.1f}/{core['p99']:.1f} ms, "
          f"pubsub {pubsub['p50']:.1f}/{pubsub['p99']:.1f} ms; p99 ratio pubsub/core = {pubsub['p99'] / core['p99']:.3f}; "
          f"target p99 < {TARGET_P99_MS:g} ms: core {verdict(core)}, pubsub {verdict(pubsub)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
