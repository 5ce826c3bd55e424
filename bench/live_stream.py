"""Live stream latency: events published by a worker process reach N browser websockets.

    python -m bench.live_stream [--clients 50] [--rate 200] [--seconds 5] [--client-procs 2]
                                [--server daphne|uvicorn] [--layer core|pubsub] [--no-baseline]

A worker process publishes `experience.created` events through `event_publish_async` at a
fixed rate; a real server fans them out to N authenticated websocket clients of the run;
each client timestamps arrival, checks that events arrive in order, and counts what it
missed. Phases, in the same run and on the same channel layer:

  per-client  the path before apps/runs/fanout.py (bench/per_client_asgi.py under daphne):
              every socket is a stream member, so one layer message and one encode per
              socket per event. The baseline, at N clients.
  hub         the project's consumer: one subscription per process per run, one encode per
              flush, frames batched under load. At 1 client and at N, on one server
              process (the first phase's sockets gone, and the run's subscription with them,
              before the second's connect).

The clients run in --client-procs reader processes (no Django in them), so that parsing
10,000 events/s is not one process's work on a small machine; each phase prints the CPU
seconds that the server and the readers used. Target (issue #5): p99 < 100 ms at 50 clients
and 200 events/s with no lost deliveries. The last line prints the p99 ratio hub /
per-client at N clients and the verdict for each.

Needs DATABASE_URL (Postgres) and REDIS_URL; makes and drops its own database. BENCH_LOG=path
keeps the servers' stderr; BENCH_DUMP=path writes "client seq latency_ms" lines per reader.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import free_port, health_wait, processes_stop, server_env

ROOT = Path(__file__).resolve().parents[1]
TARGET_P99_MS = 100.0
DRAIN_SECONDS = 10.0  # how long readers wait for stragglers after the publisher is done


def _setup_django() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "rftweb.settings")
    import django

    django.setup()


async def _publish(run_id: int, rate: float, seconds: float) -> None:
    from apps.runs.events import event_publish_async

    # A fresh process's first publish takes ~150 ms (lazy imports, the Redis connection, the
    # layer's script): warm up first, as a long-lived worker is, so that cold start does not
    # land on the first measured events. Readers ignore this event's type.
    await event_publish_async(run_id=run_id, type="run.metric", payload={"warmup": True})
    await asyncio.sleep(0.3)
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


# ---------------------------------------------------------------------------- readers


async def _reader_phase(*, url: str, origin: str, cookie: str, clients: int, expected: int) -> dict[str, Any]:
    """One reader process: connect, say "ready", read until every event came or the main
    process says the publisher is done and DRAIN_SECONDS passed; return what was seen."""
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed

    conns = [await connect(url, additional_headers={"Origin": origin, "Cookie": cookie}, open_timeout=30,
                           max_queue=None, compression=None) for _ in range(clients)]
    latencies: list[float] = []
    received = [0] * clients
    out_of_order = [0]
    frames = [0]
    closed: list[str] = []
    dump = open(os.environ["BENCH_DUMP"] + f".{os.getpid()}", "w") if os.environ.get("BENCH_DUMP") else None

    async def read(i: int, ws: Any) -> None:
        last = -1
        try:
            async for raw in ws:
                now = time.time()
                frames[0] += 1
                frame = json.loads(raw)
                events = frame["events"] if frame.get("type") == "batch" else [frame]
                for msg in events:
                    if msg.get("type") != "experience.created":
                        continue
                    payload = msg["payload"]
                    latencies.append((now - payload["t"]) * 1000.0)
                    if dump is not None:
                        dump.write(f"{i} {payload['seq']} {latencies[-1]:.2f}\n")
                    if payload["seq"] <= last:
                        out_of_order[0] += 1
                    last = payload["seq"]
                    received[i] += 1
                if received[i] >= expected:
                    return
        except ConnectionClosed as exc:  # counted as lost; the reason is reported
            closed.append(str(exc))

    cpu0 = time.process_time()
    readers = [asyncio.create_task(read(i, ws)) for i, ws in enumerate(conns)]
    print("ready", flush=True)
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.readline)  # the publisher is done
    done, pending = await asyncio.wait(readers, timeout=DRAIN_SECONDS)
    for t in pending:
        t.cancel()
    cpu = time.process_time() - cpu0
    for ws in conns:
        await ws.close()
    return {"latencies": latencies, "received": received, "out_of_order": out_of_order[0], "frames": frames[0],
            "closed": closed, "cpu": cpu}


def reader_main(args: argparse.Namespace) -> None:
    result = asyncio.run(_reader_phase(url=args.url, origin=args.origin, cookie=args.cookie, clients=args.clients,
                                       expected=args.expected))
    print(json.dumps(result), flush=True)


# ---------------------------------------------------------------------------- the phases


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    k = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[k]


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _phase(*, url: str, origin: str, cookie: str, run_id: int, clients: int, procs: int, rate: float, seconds: float,
           env: dict[str, str], server_pid: int) -> dict[str, Any]:
    expected = int(rate * seconds)
    shares = [clients // procs + (1 if i < clients % procs else 0) for i in range(procs)]
    readers = [
        subprocess.Popen(
            [sys.executable, "-m", "bench.live_stream", "--read", "--url", url, "--origin", origin, "--cookie", cookie,
             "--clients", str(n), "--expected", str(expected)],
            cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        for n in shares if n
    ]
    for r in readers:
        assert r.stdout is not None
        if r.stdout.readline().strip() != "ready":
            raise RuntimeError("a reader process did not connect")
    time.sleep(0.5)  # let every subscription settle
    server_cpu0 = _cpu_seconds(server_pid)
    subprocess.run([sys.executable, "-m", "bench.live_stream", "--publish", "--run-id", str(run_id), "--rate", str(rate),
                    "--seconds", str(seconds)], cwd=ROOT, env=env, check=True)
    for r in readers:
        assert r.stdin is not None
        r.stdin.write("done\n")
        r.stdin.flush()
    parts = [json.loads(r.communicate(timeout=DRAIN_SECONDS + 60)[0]) for r in readers]
    server_cpu = _cpu_seconds(server_pid) - server_cpu0
    latencies = [x for p in parts for x in p["latencies"]]
    total = sum(sum(p["received"]) for p in parts)
    return {
        "clients": clients, "events": expected, "delivered": total, "lost": expected * clients - total,
        "p50": _percentile(latencies, 50), "p99": _percentile(latencies, 99), "max": max(latencies, default=float("nan")),
        "mean": statistics.fmean(latencies) if latencies else float("nan"),
        "out_of_order": sum(p["out_of_order"] for p in parts), "frames": sum(p["frames"] for p in parts),
        "closed": sorted({c for p in parts for c in p["closed"]}),
        "server_cpu": server_cpu, "reader_cpu": sum(p["cpu"] for p in parts),
    }


def _server_command(server: str, app: str, port: int) -> list[str]:
    if server == "uvicorn":
        # No per-message deflate: daphne does not compress either, and browsers' frames here are small.
        return [sys.executable, "-m", "uvicorn", app, "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning",
                "--ws", "websockets-sansio", "--ws-per-message-deflate", "false", "--no-access-log"]
    return [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), app]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--rate", type=float, default=200.0, help="events per second")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--client-procs", type=int, default=2, help="reader processes the clients are spread over")
    parser.add_argument("--server", choices=("daphne", "uvicorn"), default="daphne", help="server of the hub phases")
    parser.add_argument("--layer", choices=("core", "pubsub"), default="core", help="channel layer of every phase")
    parser.add_argument("--no-baseline", action="store_true", help="skip the per-client phase")
    parser.add_argument("--publish", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--run-id", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--read", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--origin", help=argparse.SUPPRESS)
    parser.add_argument("--cookie", help=argparse.SUPPRESS)
    parser.add_argument("--expected", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.publish:
        publisher_main(args)
        return 0
    if args.read:
        reader_main(args)
        return 0
    if args.clients < 1 or args.rate <= 0 or args.seconds <= 0 or args.client_procs < 1:
        parser.error("clients, rate, seconds and client-procs must be positive")
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

    phases = [("hub", args.server, "rftweb.asgi:application", 1), ("hub", args.server, "rftweb.asgi:application", args.clients)]
    if not args.no_baseline:
        phases.insert(0, ("per-client", "daphne", "bench.per_client_asgi:application", args.clients))

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
        env["RFT_CHANNEL_LAYER"] = args.layer
        results: list[tuple[str, str, dict[str, Any]]] = []
        log_path = Path(os.environ.get("BENCH_LOG", "/dev/null"))
        log = open(log_path, "a")
        running: tuple[str, str] | None = None  # (server, app) of `server`
        port = 0
        for path, server_name, app, clients in phases:
            # The hub phases (1 client, then N) share one server: a server start is Django's
            # set-up again (seconds of CPU), and the hub's subscription ends with its last socket.
            if running != (server_name, app):
                if server is not None:
                    processes_stop([server])
                    server = None
                port = free_port()
                server = started = subprocess.Popen(_server_command(server_name, app, port), cwd=ROOT,
                                                    env=server_env(env), stdout=subprocess.DEVNULL, stderr=log)
                running = (server_name, app)
                if not health_wait(f"http://127.0.0.1:{port}", seconds=60, alive=lambda: started.poll() is None):
                    print("bench.live_stream: the server did not start", file=sys.stderr)
                    return 1
            assert server is not None
            result = _phase(
                url=f"ws://127.0.0.1:{port}/ws/runs/{run.pk}/", origin=f"http://127.0.0.1:{port}",
                cookie=f"sessionid={session.session_key}", run_id=run.pk, clients=clients,
                procs=min(args.client_procs, clients), rate=args.rate, seconds=args.seconds, env=env,
                server_pid=server.pid,
            )
            results.append((path, server_name, result))
    finally:
        if server is not None:
            processes_stop([server])
        connection.close()
        connection.creation.destroy_test_db(old_name, verbosity=0)

    load = os.getloadavg()
    print(f"layer {args.layer}, readers in {args.client_procs} processes, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    for path, server_name, r in results:
        print(f"{path:10s} {server_name:7s} {r['clients']:4d} clients, {r['events']} events at {args.rate:g}/s: "
              f"p50 {r['p50']:.1f} ms, p99 {r['p99']:.1f} ms, max {r['max']:.1f} ms, "
              f"delivered {r['delivered']}, lost {r['lost']}, out of order {r['out_of_order']}, frames {r['frames']}, "
              f"cpu s server {r['server_cpu']:.1f} readers {r['reader_cpu']:.1f}"
              + (f", connections closed: {'; '.join(r['closed'])}" if r["closed"] else ""))

    def verdict(r: dict[str, Any]) -> str:
        ok = r["p99"] < TARGET_P99_MS and r["lost"] == 0 and r["out_of_order"] == 0
        return "met" if ok else "MISSED"

    hub = results[-1][2]
    line = f"live_stream: {args.clients} clients at {args.rate:g} events/s: p50/p99 hub {hub['p50']:.1f}/{hub['p99']:.1f} ms"
    if not args.no_baseline:
        base = results[0][2]
        line += (f", per-client {base['p50']:.1f}/{base['p99']:.1f} ms; p99 ratio hub/per-client = "
                 f"{hub['p99'] / base['p99']:.3f}; target p99 < {TARGET_P99_MS:g} ms, 0 lost: "
                 f"hub {verdict(hub)}, per-client {verdict(base)}")
    else:
        line += f"; target p99 < {TARGET_P99_MS:g} ms, 0 lost: hub {verdict(hub)}"
    print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
