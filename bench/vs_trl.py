"""The same GRPO work three ways, in one run: what a user would do with stock TRL instead of
rftweb, and rftweb's loop in one process and as real Celery workers.

(a) `trl`: stock `trl.GRPOTrainer` with its own generation (`model.generate`), the demo
    taskset as a conversational dataset, the reward functions rftweb registers
    (math_accuracy + 0.1 × math_format, the same code).
(b) `inproc`: rftweb's loop in this process, what bench/learning runs: `workers.explore.explorer.explore`
    then `workers.trainer.step.trainer_step`, sync mode (every step on the newest weights, like
    TRL), through Postgres.
(c) `celery`: rftweb's whole loop with real Celery workers (conductor, explorer, trainer) on
    Postgres and Redis, async mode (max_staleness 2): exploring overlaps training.

Same demo model, taskset, seed and settings: 16 prompts × 8 samples a step, ≤ 12 tokens,
temperature 1, lr 1e-4 constant, loss `grpo`, beta 0, epsilon 0.2, group-scaled advantages,
grad-norm clip 1.

One difference in semantics: rftweb skips the optimizer step on a batch that carries no
learning signal (every advantage 0 with beta 0, `train/skipped_no_signal`; AdamW's momentum
would move the weights anyway), while stock TRL steps on every batch. With 16 groups a step
and a correctness reward a batch whose every group is tied is rare here, so the arms still do
the same work; where it happens, (b) and (c) do less of it than (a), and the weights differ.

Load on a shared machine swings by 2× within minutes, so arms run one after the other are
not comparable. (a) and (b) therefore run at the same time, each pinned to its own half of
the cores (`--cores`, default 2: one core each) with the same torch thread count, and swap
halves on every repeat: what else loads the machine loads both alike. (c) needs every core
(its explorer and trainer each get half, at least one thread, the conductor one), so it
alternates with a run of (a) on every core (`trl-all`), the order swapped on every repeat.

Held-out accuracy (greedy, the demo model's 200 held-out problems) is measured off the
clock every `--eval-every` steps: (a) and (b) stop their clock while evaluating; (c) records
each published version's time and evaluates the checkpoints after the run. Printed per arm:
seconds per step (median of the steps, and the whole-run mean), the accuracy against
wall-clock, the time to a fixed gain over the base model (`--gain` points), the step seconds'
quartiles and the load average at each arm's start and end. Ratios last: (b)/(a) seconds per
step per side-by-side repeat with their spread (target ≤ 1.10) and (a)/(c) time to the gain
(`trl-all` against (c); target ≥ 1.5).

    python -m bench.vs_trl [--steps 100] [--eval-every 10] [--gain 5] [--cores 2] [--threads N] [--repeat 2]

It works in a database of its own (bench/common.py: made per bench process, its arms' processes
share it), as arm (c)'s conductor resumes every running run of its database.

Measured 2026-11-23 (round 9), two runs of 100 steps, load 1.0-4.0 (two helper sessions
coding on the same 2 cores):
- (b)/(a) s/step per side-by-side repeat 1.09, 1.07 (run 1) and 1.08, 1.01 (run 2): median
  1.075, spread 1.01..1.09, target <= 1.10 met in 4 of 4. The model work is at par (update
  0.96 / 0.96 s, generate 0.42 / 0.51 s, rftweb / TRL, run 1 rep 1); 32 statements a step.
  (b) reached +5 points before (a) in every repeat (47.8 / 58.8, 72.7 / 82.7, 70.4 / 86.6,
  75.3 / 100.2 s): greedy accuracy on 200 problems, so partly luck.
- (a)/(c) time to +5 points: 1.27 (trl-all 62.6 s, (c) 49.4 s), then 7.19 when trl-all's two
  OpenMP threads collapsed under the helpers' load (4.24 s/step against 0.92 s alone; (c)'s
  one-thread sides did not). (c) s/step 2.25 / 1.67 against trl-all's 0.92 / 4.24. The
  overlap bound line says why the target is out of reach here: (c)'s trainer side alone,
  at one thread, takes 0.96 s a step, as long as trl-all's whole step on both cores (0.92 s),
  so overlap cannot make (c) step faster than trl-all on 2 cores; it needs the two sides on
  separate devices (GPU rollouts beside GPU training) or enough cores that a second thread
  stops paying.

Round 14 (2026-11-23), (a) and (b) only (`--arms trl,inproc`, 100 steps, 2 repeats), three runs
on a quiet host (load 0.1-2.1): (b)/(a) per repeat 1.07, 1.11 / 1.08, 1.05 / 1.05, 1.14, median
1.075, spread 1.05..1.14: target <= 1.10 met on the median, in 4 of 6 repeats. Each arm's accuracy
curve repeated to the step in every repeat and run (both reach +5 at step 40, +13 at step 80 or
90); (b) reached +5 points in 19.5-22.5 s against (a)'s 24.0-26.9 s. The third run came after
events published together went as one channel-layer envelope (40 ms an explore step with Redis),
which (b) does not show: it runs on the in-memory layer. A cProfile of (b)'s explore step outside
the model: the reward functions ~45 ms (math-verify parses ~7 cut-off answers a step, ~5 ms each;
(a) scores with the same functions), experience_write ~15 ms, the task claim ~10 ms. A cache of
parsed answers was tried and not kept: 32 of 35 parses in 8 steps were of distinct texts.
Then (c) against (a) on both cores (`--arms trl,celery`, 2 repeats, load 0.2-1.9, after the
envelope change): (a)/(c) time to +5 points 0.87 and 1.51 (target >= 1.5: met once, by (c)'s
trajectory reaching +5 at step 20, not by speed); (c)/(a) seconds a step 1.63 and 1.29 (0.64 /
0.59 s against trl-all's 0.39 / 0.46 s). trl-all's update on two threads takes 0.24-0.28 s, less
than (b)'s one-thread update (0.38-0.45 s): (c)'s trainer side alone is as long as trl-all's
whole step, so overlapping exploring cannot win on 2 cores.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.common import BENCH_DB, DEMO_DIR, ROOT, bench_worker, median, processes_stop, setup_django

TASKS_PER_STEP = 16
REPEAT = 8
MAX_TOKENS = 12
LR = 1e-4

Curve = list[tuple[int, float, float]]  # (step, seconds on the clock, held-out accuracy)


def _load() -> str:
    return "load " + "/".join(f"{x:.1f}" for x in os.getloadavg())


def _heldout_accuracy(model: Any, tokenizer_dir: Path) -> float:
    from transformers import AutoTokenizer

    from workers.models.demo import DemoSettings, problems_split, greedy_accuracy

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    tokenizer.padding_side = "left"
    was_training = model.training
    try:
        return greedy_accuracy(model=model, tokenizer=tokenizer, problems=problems_split(DemoSettings())[1])
    finally:
        model.train(was_training)


def _accuracy_at(path: str, tokenizer_dir: Path) -> float:
    import torch
    from transformers import AutoModelForCausalLM

    return _heldout_accuracy(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32), tokenizer_dir)


# ----------------------------------------------------------------------------- (a) stock TRL


def arm_trl(*, demo: Path, steps: int, eval_every: int, seed: int, threads: int,
            breakdown: dict[str, float] | None = None) -> tuple[Curve, list[float]]:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from apps.rewards.math_rules import math_accuracy, math_format
    from workers.models.demo import TASKSET_FILE

    torch.set_num_threads(threads)
    records = [json.loads(line) for line in (demo / TASKSET_FILE).read_text().splitlines()]
    dataset = Dataset.from_list(
        [{"prompt": [{"role": "user", "content": r["prompt"]}], "answer": r["answer"]} for r in records]
    )

    def _texts(completions: list[Any]) -> list[str]:
        return [c[0]["content"] if isinstance(c, list) else c for c in completions]

    def accuracy(completions: list[Any], answer: list[str], **_: Any) -> list[float]:
        return [math_accuracy(t, {"domain": "math", "reference": a}).score for t, a in zip(_texts(completions), answer)]

    def fmt(completions: list[Any], **_: Any) -> list[float]:
        return [math_format(t, {"domain": "math"}).score for t in _texts(completions)]

    tokenizer = AutoTokenizer.from_pretrained(demo)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(demo, dtype=torch.float32)
    args = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="rft-bench-trl-"), use_cpu=True, bf16=False, fp16=False,
        gradient_checkpointing=False, learning_rate=LR, lr_scheduler_type="constant", warmup_steps=0,
        max_grad_norm=1.0, report_to=[], save_strategy="no", logging_strategy="no", seed=seed, data_seed=seed,
        per_device_train_batch_size=TASKS_PER_STEP * REPEAT, gradient_accumulation_steps=1, num_generations=REPEAT,
        max_completion_length=MAX_TOKENS, temperature=1.0, top_p=1.0, loss_type="grpo", beta=0.0, epsilon=0.2,
        scale_rewards="group", reward_weights=[1.0, 0.1], max_steps=steps, num_iterations=1, log_completions=False,
        disable_tqdm=True, dataloader_num_workers=0,
    )
    curve: Curve = []
    step_times: list[float] = []

    class Clock(TrainerCallback):  # type: ignore[misc]  # transformers is skipped by mypy (pyproject): Any
        """Training time only: evaluation runs with the clock stopped."""

        def __init__(self) -> None:
            self.on_clock = 0.0
            self.since = 0.0
            self.step_started = 0.0

        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            curve.append((0, 0.0, _heldout_accuracy(model, demo)))
            self.since = time.perf_counter()

        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.step_started = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            now = time.perf_counter()
            step_times.append(now - self.step_started)
            self.on_clock += now - self.since
            if state.global_step % eval_every == 0 or state.global_step == steps:
                curve.append((state.global_step, self.on_clock, _heldout_accuracy(model, demo)))
                print(f"  trl    step {state.global_step:4d} {self.on_clock:7.1f} s acc {curve[-1][2]:.3f} {_load()}",
                      flush=True)
            self.since = time.perf_counter()

    trainer = GRPOTrainer(model=model, reward_funcs=[accuracy, fmt], args=args, train_dataset=dataset,
                          processing_class=tokenizer, callbacks=[Clock()])
    # The part of TRL's step that (b) does in its explore step (generate and score), timed
    # apart so the breakdowns of (a) and (b) compare; the rest is its update.
    generate_times: list[float] = []
    generate_and_score = trainer._generate_and_score_completions

    def timed_generate(*a: Any, **kw: Any) -> Any:
        started = time.perf_counter()
        try:
            return generate_and_score(*a, **kw)
        finally:
            generate_times.append(time.perf_counter() - started)

    trainer._generate_and_score_completions = timed_generate
    trainer.train()
    if breakdown is not None and generate_times:
        breakdown["generate_and_score_seconds"] = median(generate_times)
        breakdown["update_seconds"] = median([s - g for s, g in zip(step_times, generate_times)])
    return curve, step_times


# ----------------------------------------------------------------------------- (b) rftweb in process


def arm_inproc(*, demo: Path, steps: int, eval_every: int, seed: int, threads: int, owner: Any) -> tuple[Curve, list[float]]:
    import torch

    from bench.learning import _run_one

    torch.set_num_threads(threads)
    # What arm (a) does before its clock starts: import TRL and the model code (tens of
    # seconds on a loaded machine). The model loads stay in step 1, as in bench/learning.
    import trl.trainer.grpo_trainer  # noqa: F401

    import workers.algorithms.learner
    import workers.engines.hf_engine  # noqa: F401

    step_times = _CountedSteps()
    with _statements_counted() as counter:
        step_times.counter = counter
        curve = _run_one("grpo", steps=steps, eval_every=eval_every, demo=demo, owner=owner, lr=LR, loss_type="grpo",
                         seed=seed, step_times=step_times)
    return curve, step_times


class _CountedSteps(list[float]):
    """Step times that also note the database statements sent so far at the end of each
    step: the statements of a step are the difference (issue 22: round trips, 1-5 ms each
    on a loaded host, were the whole gap to stock TRL)."""

    counter: list[int]
    marks: list[int]

    def append(self, seconds: float) -> None:
        self.marks = [*getattr(self, "marks", []), self.counter[0]]
        super().append(seconds)

    def statements_per_step(self) -> float:
        marks = getattr(self, "marks", [])
        # From step 2: step 1 loads the model and sets the run up.
        per = [b - a for a, b in zip(marks, marks[1:])]
        return median(per) if per else float("nan")


@contextlib.contextmanager
def _statements_counted() -> Iterator[list[int]]:
    """Count every statement Django sends, on every thread's connection (COPY, which goes
    through psycopg's own cursor, is not counted)."""
    from django.db import connection
    from django.db.backends.signals import connection_created

    counter = [0]
    lock = threading.Lock()

    def count(execute: Any, sql: Any, params: Any, many: bool, context: Any) -> Any:
        with lock:
            counter[0] += 1
        return execute(sql, params, many, context)

    def install(sender: Any, connection: Any, **_: Any) -> None:
        connection.execute_wrappers.append(count)

    connection_created.connect(install, weak=False)
    connection.execute_wrappers.append(count)
    try:
        yield counter
    finally:
        connection_created.disconnect(install)
        connection.execute_wrappers.remove(count)


def _inproc_breakdown(run_name: str) -> dict[str, float]:
    """Median seconds of the parts of a step of (b), from the metrics the loop records."""
    from apps.runs.models import Metric, Run

    run = Run.objects.filter(name=run_name).order_by("-id").first()
    names = ("explore/step_seconds", "explore/generate_seconds", "step_seconds", "update_seconds", "sync_seconds")
    return {n: median(list(Metric.objects.filter(run=run, name=n).values_list("value", flat=True))) for n in names}


# ----------------------------------------------------------------------------- (c) rftweb, Celery, async


def _worker(name: str, queues: str, include: list[str], env: dict[str, str], logs: Path) -> subprocess.Popen[bytes]:
    return bench_worker(name, queues, include, env=env, logs=logs)


def arm_celery(*, demo: Path, steps: int, eval_every: int, seed: int, threads: int, owner: Any, tmp: Path,
               taskset: Any) -> tuple[Curve, list[float]]:
    import redis
    from django.conf import settings

    from apps.runs.models import ModelVersion, Run
    from apps.runs.services import run_create, run_transition

    redis.Redis.from_url(settings.REDIS_URL).flushdb()
    side = str(max(1, threads // 2))
    base_env = dict(os.environ, DATABASE_URL=BENCH_DB, DJANGO_SETTINGS_MODULE="rftweb.settings", PYTHONPATH=str(ROOT),
                    RFT_STORAGE_DIR=str(tmp / "storage"))
    # The loop's beat (conductor-beat, every RFT_CONDUCT_SECONDS) drives the run: without it
    # nothing sends the first explore step. As docker-compose runs it: its own process.
    beat = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "rftweb", "beat", "-s", str(tmp / "celerybeat-schedule"), "-l", "WARNING"],
        cwd=ROOT, env={**base_env, "OMP_NUM_THREADS": "1"}, stdout=(tmp / "beat.log").open("ab"), stderr=subprocess.STDOUT,
    )
    procs = [
        beat,
        _worker("conductor", "default", [], {**base_env, "OMP_NUM_THREADS": "1"}, tmp),
        _worker("trainer", "train", ["workers.trainer"], {**base_env, "OMP_NUM_THREADS": side}, tmp),
        _worker("explorer", "rollout", ["workers.explore.explorer"], {**base_env, "OMP_NUM_THREADS": side}, tmp),
    ]

    def config(n: int) -> dict[str, Any]:
        return {
            "model": str(demo), "mode": "async", "algorithm": "grpo", "engine": "transformers", "seed": seed,
            "sync_interval": 1, "sync_offset": 0, "max_staleness": 2, "explore_batch_size": TASKS_PER_STEP,
            "repeat_times": REPEAT, "train_batch_size": TASKS_PER_STEP * REPEAT, "total_steps": n,
            "epochs": -(-n * TASKS_PER_STEP // 256) + 2, "sampling": {"temperature": 1.0, "max_tokens": MAX_TOKENS},
            "rewards": [{"name": "math_accuracy"}, {"name": "math_format", "weight": 0.1}],
            "trainer": {"learning_rate": LR, "loss_type": "grpo"},
        }

    def timed(n: int) -> tuple[Any, float, float]:
        run = run_create(name=f"bench vs_trl celery {n}", owner=owner, config=config(n), taskset=taskset)
        started_wall = time.time()
        started = time.perf_counter()
        run_transition(run=run, action="start")
        deadline = started + 3600
        while time.perf_counter() < deadline:
            run.refresh_from_db()
            if run.status in (Run.Status.STOPPED, Run.Status.FAILED) or getattr(run.Status, "FINISHED", None) == run.status:
                break
            time.sleep(0.2)
        seconds = time.perf_counter() - started
        if run.train_step != n:
            raise SystemExit(f"celery run did not finish: status={run.status} train_step={run.train_step} error={run.error}")
        return run, seconds, started_wall

    try:
        time.sleep(10)  # workers up
        timed(1)  # warm-up: both workers load the model and TRL once, as (a) and (b) do before their clocks
        run, seconds, started_wall = timed(steps)
    finally:
        processes_stop(procs)
    curve: Curve = [(0, 0.0, _accuracy_at(str(demo), demo))]
    versions = ModelVersion.objects.filter(run=run).order_by("number")
    for v in versions:
        if v.train_step > 0 and (v.train_step % eval_every == 0 or v.train_step == steps):
            curve.append((v.train_step, v.created_at.timestamp() - started_wall, _accuracy_at(v.checkpoint, demo)))
            print(f"  celery step {v.train_step:4d} {curve[-1][1]:7.1f} s acc {curve[-1][2]:.3f}", flush=True)
    return curve, [seconds / steps]


# ----------------------------------------------------------------------------- report


def _time_to_gain(curve: Curve, gain: float) -> float | None:
    base = curve[0][2]
    return next((seconds for _, seconds, acc in curve[1:] if 100 * (acc - base) >= gain), None)


def _arm_child(args: argparse.Namespace) -> None:
    """One arm in this (fresh) process; its result goes to `--result` as JSON."""
    load_start = _load()
    tmp = Path(tempfile.mkdtemp(prefix=f"rft-bench-vs-trl-{args.arm}-"))
    os.environ["RFT_STORAGE_DIR"] = str(tmp / "storage")
    if args.arm == "inproc":
        # As bench/learning: the in-process broker and cache, nothing sent anywhere.
        os.environ["REDIS_URL"] = ""
    setup_django()
    from django.contrib.auth.models import User

    from apps.buffer.importers import taskset_import
    from apps.runs.models import Run
    from workers.models.demo import TASKSET_FILE

    demo = DEMO_DIR
    # An owner per arm: arms run side by side, and each stops only its own leftovers.
    owner, _ = User.objects.get_or_create(username=f"bench-vs-trl-{args.arm}")
    # This arm's runs that an earlier, interrupted run of it left running would take the
    # workers' time (the conductor resumes every running run of the database it starts on).
    Run.objects.filter(owner=owner, status=Run.Status.RUNNING).update(status=Run.Status.STOPPED)
    threads = args.threads
    breakdown: dict[str, float] = {}
    statements: float | None = None
    try:
        if args.arm == "trl":
            curve, times = arm_trl(demo=demo, steps=args.steps, eval_every=args.eval_every, seed=args.seed, threads=threads,
                                   breakdown=breakdown)
        elif args.arm == "inproc":
            curve, times = arm_inproc(demo=demo, steps=args.steps, eval_every=args.eval_every, seed=args.seed,
                                      threads=threads, owner=owner)
            breakdown = _inproc_breakdown(f"bench learning grpo seed {args.seed}")
            assert isinstance(times, _CountedSteps)
            statements = times.statements_per_step()
            Run.objects.filter(owner=owner, status=Run.Status.RUNNING).update(status=Run.Status.STOPPED)
        elif args.arm == "celery":
            taskset = taskset_import(name="demo vs_trl", path=demo / TASKSET_FILE, owner=owner)
            curve, times = arm_celery(demo=demo, steps=args.steps, eval_every=args.eval_every, seed=args.seed,
                                      threads=args.cores, owner=owner, tmp=tmp, taskset=taskset)
        else:
            raise SystemExit(f"unknown arm {args.arm!r}; use trl, inproc, celery")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    Path(args.result).write_text(json.dumps({"curve": curve, "times": list(times), "breakdown": breakdown,
                                             "statements_per_step": statements, "load": _load(),
                                             "load_start": load_start}))


def _launch(*, arm: str, args: argparse.Namespace, cores: list[int], threads: int, result: str) -> subprocess.Popen[bytes]:
    """One arm in a fresh process (no import cache, thread pool or resident model carried
    over), pinned to `cores` with `threads` torch threads."""
    cmd = [sys.executable, "-m", "bench.vs_trl", "--arm", arm, "--result", result, "--steps", str(args.steps),
           "--eval-every", str(args.eval_every), "--seed", str(args.seed), "--cores", str(len(cores)),
           "--threads", str(threads)]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    return subprocess.Popen(cmd, cwd=ROOT, env=env, preexec_fn=lambda: os.sched_setaffinity(0, cores))


def _collect(proc: subprocess.Popen[bytes], arm: str, result: str) -> dict[str, Any]:
    if proc.wait() != 0:
        raise SystemExit(f"arm {arm} failed")
    data: dict[str, Any] = json.loads(Path(result).read_text())
    data["curve"] = [tuple(p) for p in data["curve"]]
    return data


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--gain", type=float, default=5.0, help="the fixed gain over the base model, in points")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cores", type=int, default=min(2, os.cpu_count() or 1), help="CPU set the bench is pinned to")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads of (a) and (b) (default: the cores each gets); (c)'s sides get half each")
    parser.add_argument("--arms", default="trl,inproc,celery")
    parser.add_argument("--repeat", type=int, default=2,
                        help="repeats; (a) and (b) swap cores and (a) and (c) swap order on each")
    parser.add_argument("--arm", help=argparse.SUPPRESS)  # internal: run one arm in this process
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args()
    cores = sorted(os.sched_getaffinity(0))[: args.cores]
    os.sched_setaffinity(0, cores)  # children (each arm, the Celery workers) inherit it
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.arm:
        args.threads = args.threads or args.cores
        os.environ["OMP_NUM_THREADS"] = str(args.threads)
        _arm_child(args)
        return
    from workers.models.demo import demo_model_build

    demo_model_build(out=DEMO_DIR, progress=False, log=lambda _: None)
    # Make and migrate this bench's database once, before arms start side by side (the arms,
    # its child processes, find it in their environment: bench.common.database_own).
    from bench.common import database_own

    database_own()
    subprocess.run([sys.executable, "-c", "from bench.common import setup_django; setup_django()"], cwd=ROOT, check=True)
    arms = args.arms.split(",")
    # (a) and (b) run at the same time, each pinned to its own half of the cores (both on the
    # same core when there is one), and swap halves on every repeat: whatever else loads the
    # machine loads both alike. (c) needs every core, so it alternates with (a) on every core.
    half = max(1, len(cores) // 2)
    sides = (cores[:half], cores[half:] or cores[:half])
    pair_threads = args.threads or half
    results: list[tuple[int, str, dict[str, Any]]] = []
    for rep in range(args.repeat):
        # (a) alone on half the cores says nothing when it is here only as (c)'s baseline.
        paired = [a for a in ("trl", "inproc") if a in arms] if "inproc" in arms or "celery" not in arms else []
        if paired:
            order = paired if rep % 2 == 0 else paired[::-1]
            with tempfile.TemporaryDirectory() as out:
                procs = []
                for arm, arm_cores in zip(order, sides):
                    print(f"[{rep + 1}/{args.repeat}] {arm}: {args.steps} steps on cores {arm_cores}, {pair_threads} "
                          f"thread(s), side by side with {' '.join(a for a in order if a != arm) or 'nothing'}, {_load()}",
                          flush=True)
                    result = str(Path(out) / f"{arm}.json")
                    procs.append((arm, result, _launch(arm=arm, args=args, cores=arm_cores, threads=pair_threads,
                                                       result=result)))
                for arm, result, proc in procs:
                    results.append((rep, arm, _collect(proc, arm, result)))
        if "celery" in arms:
            order = ["celery", "trl"] if rep % 2 == 0 else ["trl", "celery"]
            for arm in order:
                label = "trl-all" if arm == "trl" else arm
                print(f"[{rep + 1}/{args.repeat}] {label}: {args.steps} steps on cores {cores}, {_load()}", flush=True)
                with tempfile.TemporaryDirectory() as out:
                    result = str(Path(out) / f"{arm}.json")
                    proc = _launch(arm=arm, args=args, cores=cores, threads=args.threads or len(cores), result=result)
                    results.append((rep, label, _collect(proc, arm, result)))
    _report(args, cores, results, pair_threads=pair_threads)


def _quartiles(values: list[float]) -> str:
    from bench.common import percentile

    return f"{percentile(values, 0.25):.3f}..{percentile(values, 0.75):.3f}"


def _report(args: argparse.Namespace, cores: list[int], results: list[tuple[int, str, dict[str, Any]]], *,
            pair_threads: int) -> None:
    print()
    print(f"{args.steps} steps of {TASKS_PER_STEP} prompts x {REPEAT} samples, <= {MAX_TOKENS} tokens; seed {args.seed}; "
          f"cores {cores}; (a) and (b) side by side, {pair_threads} torch thread(s) each on their own core(s), swapping "
          f"cores each repeat; (c) and trl-all alternate on every core, (c) {max(1, args.cores // 2)} thread(s) per "
          f"side; fixed gain {args.gain:+.1f} pts")
    print(f"{'rep':<4}{'arm':<8}{'step':>6}{'seconds':>10}{'accuracy':>10}{'gain':>8}")
    for rep, arm, data in results:
        curve = data["curve"]
        for step, seconds, acc in curve:
            print(f"{rep + 1:<4}{arm:<8}{step:>6}{seconds:>10.1f}{acc:>10.3f}{100 * (acc - curve[0][2]):>+8.1f}")
    print()
    print(f"{'rep':<4}{'arm':<8}{'s/step median':>14}{'p25..p75':>14}{'s/step mean':>12}{'to gain (s)':>12}"
          "  load at start -> end (1/5/15 min)")
    per_step: dict[int, dict[str, float]] = {}
    to_gain: dict[int, dict[str, float | None]] = {}
    for rep, arm, data in results:
        curve = data["curve"]
        mean = curve[-1][1] / curve[-1][0] if curve[-1][0] else float("nan")
        per_step.setdefault(rep, {})[arm] = median(data["times"]) if arm != "celery" else mean
        to_gain.setdefault(rep, {})[arm] = _time_to_gain(curve, args.gain)
        reached = to_gain[rep][arm]
        gain_text = f"{reached:.1f}" if reached is not None else "not reached"
        spread = _quartiles(data["times"]) if arm != "celery" else "-"
        print(f"{rep + 1:<4}{arm:<8}{per_step[rep][arm]:>14.3f}{spread:>14}{mean:>12.3f}{gain_text:>12}  "
              f"{data.get('load_start', '?')} -> {data['load']}")
        if data.get("breakdown"):
            print(f"    {arm} step medians (s): " + ", ".join(f"{k} {v:.3f}" for k, v in data["breakdown"].items()))
        if data.get("statements_per_step") is not None:
            print(f"    {arm} database statements per step (median from step 2; COPY not counted): "
                  f"{data['statements_per_step']:.1f}")
    ratios = []
    b_a = [r["inproc"] / r["trl"] for r in per_step.values() if "trl" in r and "inproc" in r]
    if b_a:
        # Other work pinned to one core slows whichever arm sits there (by 40% in a run of this
        # bench): over a pair of repeats that swapped cores a factor per core cancels in the
        # geometric mean of the two ratios, where the median of a few repeats keeps it.
        swapped = [math.sqrt(x * y) for x, y in zip(b_a[0::2], b_a[1::2])]
        ratios.append(f"(b)/(a) s/step {median(b_a):.2f} median of {len(b_a)} side-by-side repeats "
                      f"({', '.join(f'{x:.2f}' for x in b_a)}; spread {min(b_a):.2f}..{max(b_a):.2f}; target <= 1.10)"
                      + (f"; geometric mean per core-swapped pair {', '.join(f'{x:.2f}' for x in swapped)}" if swapped else ""))
    a_c = []
    for r in to_gain.values():
        if "trl-all" in r and "celery" in r:
            a, c = r["trl-all"], r["celery"]
            a_c.append(f"{a / c:.2f}" if a is not None and c is not None else f"not reached by {'trl' if a is None else 'celery'}")
    if a_c:
        ratios.append(f"(a)/(c) time to {args.gain:+.0f} pts: {', '.join(a_c)} (target >= 1.5)")
    c_a = [r["celery"] / r["trl-all"] for r in per_step.values() if "trl-all" in r and "celery" in r]
    if c_a:
        ratios.append(f"(c)/(a) s/step {', '.join(f'{x:.2f}' for x in c_a)}")
    # What overlap can buy on these cores: (c)'s explorer and trainer get half the cores each,
    # so its step is at best the slower side at that thread count ((b)'s medians, one side at
    # a time), against trl-all's whole step on every core. Below 1, (c) cannot step faster
    # than trl-all however well it overlaps, and reaches a gain sooner only by learning more
    # per step.
    floors = [max(d["breakdown"].get("explore/step_seconds", 0.0), d["breakdown"].get("update_seconds", 0.0))
              for _, arm, d in results if arm == "inproc" and d.get("breakdown")]
    trl_all = [v["trl-all"] for v in per_step.values() if "trl-all" in v]
    if floors and trl_all and pair_threads == max(1, args.cores // 2):
        print(f"overlap bound: (c)'s step >= the slower side at {pair_threads} thread(s) = {median(floors):.3f} s "
              f"((b)'s medians) against trl-all's {median(trl_all):.3f} s/step: (c) at most "
              f"{median(trl_all) / median(floors):.2f}x trl-all's steps per second on these cores")
    print("; ".join(ratios))


if __name__ == "__main__":
    main()
