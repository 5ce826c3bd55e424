"""The rollout worker's CPU per OpenAI chat call beyond the engine, with the engine stubbed out.

bench/openai_endpoint sets the endpoint against the engine, but on a busy host the engine's own
CPU per generation swings between rounds by more than the worker adds around it. Here a real
solo rollout worker (this module with `--serve`) serves `workers.explore.chat.chat` tasks sent the
endpoint's way (a reply list and ignore_result, with the run's config digest and current
version: apps/envapi/openai_services.py), all queued at once, as 16 waiting clients keep its
queue full. Its engine generates once, then hands back that generation for every call, so the
worker's CPU time is everything else: Celery's handling of each message, the chat template,
decoding, the reply. Prints the worker's CPU milliseconds per call; `--profile FILE` writes a
cProfile of those calls (CPU time; about three times slower, so the shares are what it tells).

    python -m bench openai_worker_cpu [--calls 400 --warm 4 --tokens 16 --profile worker.prof]

Nov 2026, paired runs at load 4.0-4.9: 4.25 and 4.50 ms per call before the changes
bench/openai_endpoint's docstring lists (a sixth of it kombu building a redis-py client per
delivery and per ack), 3.32 and 3.55 after.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import BENCH_DB, ROOT, processes_stop, setup_django


def serve(args: argparse.Namespace) -> None:
    """The worker: counts calls; measures (and profiles) calls warm+1 … warm+calls, then stops."""
    import cProfile

    import django

    sys.path.insert(0, str(ROOT))
    django.setup()
    from celery import signals

    from rftweb.celery import app
    from rftweb.taskkit import on_signal
    from workers.engines import hf_engine

    generate = hf_engine.HFEngine.generate
    canned: list[Any] = []

    def stubbed(self: Any, *a: Any, **kw: Any) -> Any:
        if not canned:
            canned.append(generate(self, *a, **kw))
        return canned[0]

    hf_engine.HFEngine.generate = stubbed  # type: ignore[method-assign]
    profile = cProfile.Profile(time.process_time) if args.profile else None
    done, started = [0], [0.0]

    @on_signal(signals.task_postrun, weak=False)
    def counted(**_: Any) -> None:
        done[0] += 1
        if done[0] == args.warm:
            started[0] = time.process_time()
            if profile is not None:
                profile.enable()
        elif done[0] == args.warm + args.calls:
            if profile is not None:
                profile.disable()
                profile.dump_stats(args.profile)
            spent = time.process_time() - started[0]
            print(f"worker CPU ms per call (engine stubbed): {1000 * spent / args.calls:.2f}"
                  + (f"  (profiled, {args.profile})" if profile is not None else ""), flush=True)
            os.kill(os.getpid(), signal.SIGTERM)

    app.worker_main(["worker", "-P", "solo", "-Q", "rollout", "-n", f"cpu-{os.getpid()}@%h", "--include", "workers.explore.explorer",
                     "--without-heartbeat", "--without-gossip", "--without-mingle", "-l", "warning"])


def drive(args: argparse.Namespace) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    setup_django()
    from apps.envapi import token_stream
    from apps.envapi.openai_services import CHAT_TASK, worker_request_build
    from apps.envapi.services import rollout_task_send
    from bench.openai_endpoint import _load, _model
    from rftweb.celery import app
    from tests.factories import make_run, make_user

    if token_stream.reply_key_new() is None:
        sys.exit("needs Redis (REDIS_URL)")
    model = _model(Path(args.model_dir))
    run = make_run(owner=make_user(f"bench-{os.getpid()}"), name="bench-worker-cpu", model=str(model), engine="transformers",
                   sampling={"temperature": 1.0, "max_tokens": args.tokens})
    env = dict(os.environ, DATABASE_URL=BENCH_DB, DJANGO_SETTINGS_MODULE="rftweb.settings", LOG_LEVEL="WARNING",
               PYTHONPATH=str(ROOT))
    command = [sys.executable, "-m", "bench", "openai_worker_cpu", "--serve", "--calls", str(args.calls), "--warm", str(args.warm)]
    if args.profile:
        command += ["--profile", str(Path(args.profile).resolve())]
    app.control.purge()
    print(f"{args.calls} calls queued at once after {args.warm} warm-up calls, {args.tokens} tokens each; {_load()}", flush=True)
    # The worker prints through Celery, which redirects stdout to its log (stderr).
    worker = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    client = token_stream._sync_client()

    def send(i: int) -> str:
        request = {"endpoint": "chat", "messages": [{"role": "user", "content": f"What is {i % 50} + {i % 7}?"}], "tools": None,
                   "tool_choice": None, "n": 1, "sampling": {"logprobs": 0, "temperature": 1.0, "max_tokens": args.tokens},
                   "version": None}
        key = token_stream.reply_key_new()
        assert key is not None
        rollout_task_send(task=CHAT_TASK, args=[run.pk, {**worker_request_build(run=run, request=request), "reply_key": key}],
                          timeout=600, ignore_result=True)
        return key

    def answer(key: str) -> None:
        for _ in range(300):
            popped = client.blpop([key], timeout=2)
            if popped:
                assert "prompts" in json.loads(popped[1]), popped[1]
                return
            if worker.poll() is not None:
                sys.exit("the worker died")
        sys.exit("no answer in 10 minutes")

    try:
        for i in range(args.warm):
            answer(send(i))
        keys = [send(i) for i in range(args.calls)]
        started = time.perf_counter()
        for key in keys:
            answer(key)
        print(f"{args.calls} calls in {time.perf_counter() - started:.2f} s", flush=True)
        out, _ = worker.communicate(timeout=60)
        print("".join(line[line.index("worker CPU"):] + "\n" for line in out.splitlines() if "worker CPU" in line), end="")
        print(_load())
    finally:
        processes_stop([worker])
        run.delete()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--warm", type=int, default=4, help="calls before measuring (the engine loads on the first)")
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--profile", help="write a cProfile of the measured calls here")
    parser.add_argument("--model-dir", default=str(ROOT / ".cache" / "bench-openai-model"))
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args)
    else:
        drive(args)


if __name__ == "__main__":
    main()
