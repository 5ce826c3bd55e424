"""The OpenAI-compatible endpoint against the rollout engine it fronts.

Sixteen concurrent clients send the same chat completions two ways (three with `--celery`),
in rounds that interleave the ways, the order flipped every round:

- `engine`: straight to a resident rollout engine in this process, one generation at a time
  in arrival order (what a solo rollout worker does with its queue; the prompt rendered by
  the same chat template beforehand, the same sampling): what the hardware does;
- `celery`: the `workers.explore.chat.chat` task on a real rollout worker, without HTTP (through
  Celery's result backend, as the environment API's rollouts wait);
- `endpoint`: the official `openai` client against daphne, through auth, validation, the
  rollout queue, the reply list and the response shaping.

Prints, per round and way, requests/s and p50/p99 latency with the load average beside them
and the CPU milliseconds per request of each process taking part (this one, the worker,
daphne); per round the ratio endpoint p50 / engine p50; at the end every round's ratio, their
spread, and on the last line their median (target: at most 1.10 at the engine's own
throughput). The rollout engines serve one generation at a time per worker, so with 16
clients the latency is mostly queueing: the ratio is about the worker's time per call against
the engine's per generation. On a shared 2-core host one run of each way after the other swung
from 0.99 to 1.53 between runs with the load; neighbouring rounds share the load, and the
median of their ratios is the figure. The CPU milliseconds per request are the steadier
profile: in Nov 2026 (load 7-15) the worker spent 33-35 ms per call against the engine's
28-30 ms per generation, daphne 9-12 ms. With the worker reading nothing from the database
per call (it keeps the run per config digest, workers/explore/chat.py), paired runs at load 3.4-5.8:
worker minus engine CPU per call 2.7-8.0 ms (median of each run's rounds) against 8.4-11.2 ms
before; the wall-clock ratio's median 1.30-1.81 (before 1.71-1.95): the host's noise swamps it.
Later in Nov 2026 the engine took ~95 ms of CPU per generation on this host, swinging ±10%
between rounds, so worker minus engine drowned. With the engine stubbed out
(bench/openai_worker_cpu: the same task path serving canned samples; load 4.0-4.9) the worker
spent 4.3-4.5 ms of CPU per call: a sixth in kombu building a redis-py client per delivery and
per ack (rftweb/broker.py keeps one), an eighth in per-token `decode` calls (now one tokenizers
call), some in Celery's repr of the result; after, 3.3-3.6 ms, the rest Celery's per-message
work and three Redis round trips (unacked entry, ack, reply). daphne, engine stubbed:
16.3-17.5 -> 13.0-13.9 ms per request (the middleware chain run in one thread, one query fewer
per key). Paired runs of this bench (3 rounds, load 3.0-3.4): daphne 17.8-20.9 ms per request
before, 13.4-16.2 after; the ratio's median 1.21 and 1.14 before, 1.14 and 1.15 after.
On the quiet host afterwards (nothing else running, load 1.0-1.4), two runs of 4 rounds: the
ratio's median 1.05 (rounds 1.03-1.07) and 1.07 (1.03-1.11), throughput endpoint/engine
0.91-0.94; worker 92-94 ms CPU per call, daphne 12.7-14.2 ms per request.

    python -m bench openai_endpoint [--clients 16 --requests 4 --rounds 6 --tokens 16 --celery --engine transformers]
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from bench.common import BENCH_DB, ROOT, free_port, percentile, processes_stop, setup_django


def _model(out: Path) -> Path:
    from workers.models.tiny import tiny_model_save

    if not (out / "model.safetensors").exists():
        tiny_model_save(out, hidden_size=128, layers=4, heads=4, max_positions=512, vocab_size=384)
    return out


def _load() -> str:
    return "load %.2f %.2f %.2f" % os.getloadavg()


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class _Cpu:
    """CPU milliseconds per request spent by each named process during a phase: on a busy
    host wall-clock latency is mostly waiting for a core, CPU time is what each part costs."""

    def __init__(self, **pids: int) -> None:
        self.pids = pids
        self.start = {name: _cpu_seconds(pid) for name, pid in pids.items()}

    def per_request(self, requests: int) -> str:
        return ", ".join(f"{name} {1000 * (_cpu_seconds(pid) - self.start[name]) / requests:.1f}"
                         for name, pid in self.pids.items())


def _hammer(call: Callable[[int], None], *, clients: int, per_client: int) -> tuple[float, list[float]]:
    """(seconds, latencies) of clients × per_client calls, `clients` at a time."""
    latencies: list[float] = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def client(c: int) -> None:
        for i in range(per_client):
            started = time.perf_counter()
            try:
                call(c * per_client + i)
            except BaseException as exc:  # reported after the run
                errors.append(exc)
                return
            with lock:
                latencies.append(time.perf_counter() - started)

    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return time.perf_counter() - started, latencies


def _fifo(serve: Callable[[int], object]) -> tuple[Callable[[int], None], Callable[[], None]]:
    """(call, stop): one server thread answers the calls in arrival order.

    That is a rollout worker's discipline (a solo worker takes one task at a time off its
    queue), without the transport. Sixteen threads calling the engine directly race for its
    lock instead, which is not first-come first-served: one thread wins it again and again, and
    the p50 then measures the lock's unfairness (50 ms p50 beside a 4.7 s p99 on a quiet host),
    not the engine."""
    import queue

    waiting: queue.Queue[tuple[int, threading.Event, list[BaseException]] | None] = queue.Queue()

    def server() -> None:
        while (item := waiting.get()) is not None:
            i, done, errors = item
            try:
                serve(i)
            except BaseException as exc:  # handed to the caller
                errors.append(exc)
            done.set()

    thread = threading.Thread(target=server, daemon=True)
    thread.start()

    def call(i: int) -> None:
        done, errors = threading.Event(), list[BaseException]()
        waiting.put((i, done, errors))
        done.wait()
        if errors:
            raise errors[0]

    def stop() -> None:
        waiting.put(None)
        thread.join()

    return call, stop


def _report(name: str, seconds: float, latencies: list[float]) -> dict[str, float]:
    row = {"rps": len(latencies) / seconds, "p50": percentile(latencies, 0.5), "p99": percentile(latencies, 0.99)}
    print(f"{name:9s} {row['rps']:7.2f} req/s  p50 {1000 * row['p50']:7.1f} ms  p99 {1000 * row['p99']:7.1f} ms  ({_load()})",
          flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--requests", type=int, default=4, help="per client per round and way")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--celery", action="store_true", help="also time the Celery task without HTTP each round")
    parser.add_argument("--engine", choices=["transformers", "vllm"], default="transformers")
    parser.add_argument("--model-dir", default=str(ROOT / ".cache" / "bench-openai-model"))
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    setup_django()
    for noisy in ("httpx", "httpx2", "openai"):
        # A line per request drowns the figures.
        logging.getLogger(noisy).setLevel(logging.WARNING)

    import openai
    import torch

    from apps.envapi.services import api_key_create
    from rftweb.celery import app
    from tests.factories import make_run, make_user
    from workers.explore.chat import chat_prompt_ids
    from workers.engines import SamplingSpec, engine_create

    torch.set_num_threads(1)
    model = _model(Path(args.model_dir))
    owner = make_user(f"bench-{os.getpid()}")
    run = make_run(owner=owner, name="bench-openai", model=str(model), engine=args.engine,
                   sampling={"temperature": 1.0, "max_tokens": args.tokens})
    _, key = api_key_create(name="bench", runs=[run], actions=["read", "submit"], rate_limit_per_minute=1_000_000)
    per_round = args.clients * args.requests
    messages = [[{"role": "user", "content": f"What is {i % 50} + {i % 7}?"}] for i in range(per_round)]
    print(f"{args.clients} clients x {args.requests} requests a way a round, {args.rounds} rounds, {args.tokens} tokens each, "
          f"engine {args.engine}; {_load()}", flush=True)

    engine = engine_create(backend=args.engine, path=str(model))
    sampling = SamplingSpec(temperature=1.0, max_tokens=args.tokens)
    prompts = [chat_prompt_ids(engine.tokenizer, messages=m, tools=None) for m in messages]
    engine.generate(prompts[:2], n=1, sampling=sampling)

    env = dict(os.environ, DATABASE_URL=BENCH_DB, DJANGO_SETTINGS_MODULE="rftweb.settings", LOG_LEVEL="WARNING",
               PYTHONPATH=str(ROOT), RFT_ROLLOUT_TIMEOUT_SECONDS="600")
    logs = ROOT / ".cache" / "bench-openai-logs"
    logs.mkdir(parents=True, exist_ok=True)
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "rftweb", "worker", "-P", "solo", "-Q", "rollout", "-n", f"bench-{os.getpid()}@%h",
         "--include", "workers.explore.explorer", "--without-heartbeat", "--without-gossip", "--without-mingle", "-l", "warning"],
        cwd=ROOT, env=env, stdout=(logs / "worker.log").open("wb"), stderr=subprocess.STDOUT,
    )
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "rftweb.asgi:application"],
                              cwd=ROOT, env=env, stdout=(logs / "daphne.log").open("wb"), stderr=subprocess.STDOUT)
    ratios: list[float] = []
    try:
        app.control.purge()

        def by_engine(i: int) -> None:
            engine.generate([prompts[i]], n=1, sampling=sampling)

        def by_celery(i: int) -> None:
            request = {"endpoint": "chat", "messages": messages[i], "n": 1, "sampling": {"temperature": 1.0, "max_tokens": args.tokens}}
            answer = app.send_task("workers.explore.chat.chat", args=[run.pk, request], queue="rollout").get(timeout=600)
            assert "error" not in answer, answer

        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/api/v1/runs/{run.pk}/openai/v1", api_key=key,
                               max_retries=0, timeout=600)
        deadline = time.monotonic() + 60
        while True:
            try:
                client.models.list()
                break
            except openai.APIConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.3)

        def by_endpoint(i: int) -> None:
            client.chat.completions.create(model=f"run-{run.pk}", messages=messages[i],  # type: ignore[arg-type]  # plain dicts, as clients send
                                           max_tokens=args.tokens, temperature=1.0)

        by_celery(0)  # the worker loads its engine
        by_endpoint(0)
        for r in range(args.rounds):
            # Interleaved, the order flipped every round: a change in the host's load lands
            # on both ways alike, and each round's ratio compares neighbours in time.
            ways = ["engine", "endpoint"] + (["celery"] if args.celery else [])
            if r % 2:
                ways.reverse()
            rows: dict[str, dict[str, float]] = {}
            print(f"round {r + 1}", flush=True)
            for way in ways:
                if way == "engine":
                    cpu = _Cpu(bench=os.getpid())
                    call, stop = _fifo(by_engine)
                    try:
                        rows[way] = _report(way, *_hammer(call, clients=args.clients, per_client=args.requests))
                    finally:
                        stop()
                elif way == "celery":
                    cpu = _Cpu(worker=worker.pid, bench=os.getpid())
                    rows[way] = _report(way, *_hammer(by_celery, clients=args.clients, per_client=args.requests))
                else:
                    cpu = _Cpu(worker=worker.pid, daphne=server.pid, bench=os.getpid())
                    rows[way] = _report(way, *_hammer(by_endpoint, clients=args.clients, per_client=args.requests))
                print(f"          CPU ms per request: {cpu.per_request(per_round)}", flush=True)
            ratios.append(rows["endpoint"]["p50"] / rows["engine"]["p50"])
            print(f"          round {r + 1}: endpoint p50 / engine p50 {ratios[-1]:.2f}, "
                  f"throughput endpoint/engine {rows['endpoint']['rps'] / rows['engine']['rps']:.2f}", flush=True)
    finally:
        processes_stop([server, worker])
        if hasattr(engine, "close"):
            engine.close()
        run.delete()
    spread = ", ".join(f"{r:.2f}" for r in ratios)
    print(f"per-round ratios {spread}; spread {min(ratios):.2f}-{max(ratios):.2f}")
    print(f"endpoint p50 / engine p50 (median of {len(ratios)} rounds): {statistics.median(ratios):.2f}  ({_load()})")


if __name__ == "__main__":
    main()
