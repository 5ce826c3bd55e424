"""Held-out accuracy against wall-clock on the demo task: GRPO, MIX (GRPO plus expert
corrections) and SFT alone on the same corrections.

The loop runs in this process, step by step, through the real code: `workers.explore.explorer.explore`
samples and scores (math_accuracy + 0.1 × math_format) into the Postgres buffer, and
`workers.trainer.step.trainer_step` claims the batch, steps TRL's loss, saves and publishes the
version the next explore step loads. No Celery (so the clock measures the loop, not queue
latency). Expert corrections are written as the annotation UI writes a human correction
(`feedback_edit`'s row: text only, `is_expert`, source human, reward 1) through
`experience_write`, the right answer for the next tasks of the taskset, before the clock starts.

Accuracy is greedy `<answer>` accuracy on the demo model's 200 held-out problems (never in
the taskset), of each published version, measured off the clock; each evaluation also prints
the expected accuracy at temperature 1 (`workers.models.demo.expected_accuracy`), which moves
with every step where greedy accuracy on 200 problems moves by luck. It counts a right answer
in any of the warm-up's four forms since the demo model's RECIPE 7 (2026-11-26; the figures
below, of RECIPE 4-6, count the bare form only, most of what those models wrote).

    python -m bench.learning [--steps 500] [--eval-every 50] [--algorithms grpo,mix,sft] [--seeds 0,1,2]
                             [--jobs 1]

--jobs N runs N (algorithm, seed) runs at a time, each in its own single-threaded process
(as bench/vs_trl runs its arms side by side): on this 2-core host `--jobs 2` runs a seed's
GRPO and MIX together, so both see the same load, in half the wall-clock.

The loop is its own conductor: nothing here sends a step to a Celery queue (the run's
dispatch rows stay idle), so the log carries no "sent again" warnings for queues no worker reads.

Measured 2026-11-23 (round 10), `--steps 400 --eval-every 50 --algorithms grpo,mix --seeds 0,1,2
--jobs 2`, quiet 2-core host (load 1.1-2.4), base greedy accuracy 0.215, expected 0.1443:
GRPO median of each seed's best gain within 10 minutes +21.5 points (seeds +27.0 / +21.5 / +20.0;
target +20 met); median curve +9.0 at 95 s, +18.5 at 312 s, +21.5 at step 400 (353 s; spread
+14.0..+27.0), ~0.9 s a step. MIX at step 400: median +35.5 against GRPO's +21.5 (per seed +3.5 /
+15.0 / +21.5; MIX >= GRPO met); MIX passes +17 by step 50.

Each algorithm runs once per seed (the run's seed: sampling and the trainer's RNG; the demo
model is the same for all). The tables print each seed's curve, then the median gain over
the seeds at each evaluated step with its spread (min..max). Targets, judged on the median:
GRPO ≥ +20 points within 10 minutes; MIX ≥ GRPO at equal steps. The last line prints both,
with the load average after each run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import DEMO_DIR, median, own_conductor, setup_django

TASKS_PER_STEP = 16
REPEAT = 8
EXPERT_PER_STEP = 32

COMMON: dict[str, Any] = {
    "engine": "transformers",
    "sync_interval": 1,
    "sync_offset": 0,
    "explore_batch_size": TASKS_PER_STEP,
    "repeat_times": REPEAT,
    "sampling": {"temperature": 1.0, "max_tokens": 12},
    "rewards": [{"name": "math_accuracy"}, {"name": "math_format", "weight": 0.1}],
}


def _config(algorithm: str, *, model: str, steps: int, lr: float = 1e-4, loss_type: str = "grpo",
            seed: int = 0) -> dict[str, Any]:
    trainer: dict[str, Any] = {"learning_rate": lr, "loss_type": loss_type}
    common = {**COMMON, "seed": seed}
    if algorithm == "grpo":
        return {**common, "model": model, "algorithm": "grpo", "mode": "sync", "total_steps": steps,
                "train_batch_size": TASKS_PER_STEP * REPEAT, "epochs": -(-steps * TASKS_PER_STEP // 256),
                "trainer": trainer}
    if algorithm == "mix":
        size = TASKS_PER_STEP * REPEAT + EXPERT_PER_STEP
        return {**common, "model": model, "algorithm": "mix", "mode": "sync", "total_steps": steps,
                "train_batch_size": size, "epochs": -(-steps * TASKS_PER_STEP // 256),
                "trainer": {**trainer, "mu": 0.2, "expert_share": EXPERT_PER_STEP / size}}
    if algorithm == "sft":
        return {**common, "model": model, "algorithm": "sft", "mode": "train", "total_steps": steps,
                "train_batch_size": EXPERT_PER_STEP, "trainer": trainer}
    raise SystemExit(f"unknown algorithm {algorithm!r}")


def _corrections_write(*, run: Any, taskset: Any, count: int) -> None:
    """Human corrections as `feedback_edit` writes them: text only (no tokens), expert."""
    from apps.buffer.drafts import ExperienceDraft
    from apps.buffer.models import Experience
    from apps.buffer.services import experience_write
    from kernel.rewards import reference_text

    tasks = list(taskset.tasks.order_by("id"))
    rows = []
    for i in range(count):
        task = tasks[i % len(tasks)]
        rows.append(ExperienceDraft(
            run_id=run.pk, key=f"bench-edit:{i}", group_id=f"expert-{i}", task_id=task.pk,
            source=Experience.Source.HUMAN, prompt_text=task.prompt,
            response_text=f"<answer>{reference_text(task)}</answer>", is_expert=True,
            status=Experience.Status.READY, human_reward=1.0, reward=1.0, model_version=0,
        ))
    experience_write(experiences=rows)


def _accuracy(model_dir: str, tokenizer_dir: Path) -> float:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from workers.models.demo import DemoSettings, problems_split, greedy_accuracy
    from workers.weights.handover import pending_wait

    pending_wait()  # the in-memory handover writes the version's files in the background
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)  # the reloaded one, as engines see it
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return greedy_accuracy(model=model, tokenizer=tokenizer, problems=problems_split(DemoSettings())[1])


def _expected_accuracy(model_dir: str, tokenizer_dir: Path) -> float:
    """Held-out expected accuracy at temperature 1 (workers.models.demo.expected_accuracy):
    what GRPO raises, with far less noise than greedy accuracy on 200 problems."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from workers.models.demo import DemoSettings, problems_split, expected_accuracy

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return expected_accuracy(model=model, tokenizer=tokenizer, problems=problems_split(DemoSettings())[1])


def _run_one(algorithm: str, *, steps: int, eval_every: int, demo: Path, owner: Any, lr: float,
             loss_type: str, seed: int = 0, step_times: list[float] | None = None) -> list[tuple[int, float, float]]:
    """[(step, training seconds so far, held-out accuracy)], step 0 being the base model;
    each step's seconds are appended to `step_times` when given."""
    from apps.buffer.importers import taskset_import
    from apps.buffer.services import task_attempts_create
    from apps.runs.models import Run
    from apps.runs.services import run_create
    from workers.models.demo import TASKSET_FILE

    taskset = taskset_import(name=f"demo {algorithm}", path=demo / TASKSET_FILE, owner=owner)
    config = _config(algorithm, model=str(demo), steps=steps, lr=lr, loss_type=loss_type, seed=seed)
    run = run_create(name=f"bench learning {algorithm} seed {seed}", owner=owner, config=config, taskset=taskset)
    if algorithm in ("mix", "sft"):
        _corrections_write(run=run, taskset=taskset, count=steps * EXPERT_PER_STEP)
    # Running without the conductor: this process is the conductor.
    Run.objects.filter(pk=run.pk).update(status=Run.Status.RUNNING)
    explores = algorithm != "sft"
    if explores:
        for epoch in range(run.cfg.epochs):
            task_attempts_create(run=run, epoch=epoch)
    base = _accuracy(str(demo), demo)
    base_expected = _expected_accuracy(str(demo), demo)
    points = [(0, 0.0, base)]
    with own_conductor():
        _steps(algorithm, run=run, steps=steps, eval_every=eval_every, demo=demo, seed=seed, points=points,
               base_expected=base_expected, step_times=step_times)
    return points


def _steps(algorithm: str, *, run: Any, steps: int, eval_every: int, demo: Path, seed: int,
           points: list[tuple[int, float, float]], base_expected: float, step_times: list[float] | None) -> None:
    from apps.runs.models import ModelVersion
    from workers.explore.explorer import explore
    from workers.trainer.step import trainer_step

    explores = algorithm != "sft"
    clock = 0.0
    for step in range(1, steps + 1):
        started = time.perf_counter()
        if explores:
            summary = explore(run_id=run.pk, step=step, worker="bench-explorer")
            if not summary.get("tasks"):
                raise SystemExit(f"{algorithm}: explore step {step} found no tasks: {summary}")
        result = trainer_step(run_id=run.pk, step=step, worker="bench-trainer")
        took = time.perf_counter() - started
        clock += took
        if step_times is not None:
            step_times.append(took)
        if result.get("status") != "trained":
            raise SystemExit(f"{algorithm}: train step {step}: {result}")
        if step % eval_every == 0 or step == steps:
            # The version published at this step (sync_interval is 1: every step publishes).
            checkpoint = ModelVersion.objects.get(run=run, train_step=step).checkpoint
            points.append((step, clock, _accuracy(checkpoint, demo)))
            print(f"  {algorithm} seed {seed} step {step:4d}  {clock:7.1f} s  acc {points[-1][2]:.3f}  "
                  f"expected {_expected_accuracy(checkpoint, demo):.4f} (base {base_expected:.4f})  "
                  f"load {os.getloadavg()[0]:.1f}", flush=True)


def _gain_within(points: list[tuple[int, float, float]], seconds: float) -> tuple[float, float]:
    """(best gain in points within `seconds` of training, when it was reached)."""
    base = points[0][2]
    best = max((p for p in points if p[1] <= seconds), key=lambda p: p[2])
    return 100 * (best[2] - base), best[1]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--eval-every", type=int, default=50)
    parser.add_argument("--algorithms", default="grpo,mix,sft")
    parser.add_argument("--seeds", default="0,1,2", help="run seeds (sampling and trainer RNG); targets use the median")
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--loss-type", default="grpo")
    parser.add_argument("--jobs", type=int, default=1, help="(algorithm, seed) runs at a time, one process each")
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)  # a --jobs child's results file
    args = parser.parse_args()
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    seeds = [int(s) for s in args.seeds.split(",")]
    algorithms = args.algorithms.split(",")
    for algorithm in algorithms:
        if algorithm not in ("grpo", "mix", "sft"):
            parser.error(f"--algorithms: unknown algorithm {algorithm!r} (grpo, mix, sft)")
    if args.jobs > 1:
        results, loads = _in_processes(args, seeds=seeds, algorithms=algorithms)
    else:
        results, loads = _in_this_process(args, seeds=seeds, algorithms=algorithms)
    if args.out is not None:
        args.out.write_text(json.dumps({"results": results, "loads": loads}))
        return
    _report(results, loads=loads, seeds=seeds, steps=args.steps)


Results = dict[str, dict[int, list[tuple[int, float, float]]]]


def _in_this_process(args: argparse.Namespace, *, seeds: list[int], algorithms: list[str]) -> tuple[Results, list[float]]:
    tmp = Path(tempfile.mkdtemp(prefix="rft-bench-learning-"))
    os.environ["RFT_STORAGE_DIR"] = str(tmp / "storage")
    # No Redis: the in-process broker and markers (nothing consumes what trainer_step sends).
    os.environ["REDIS_URL"] = ""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # a bar per checkpoint drowns the table
    setup_django()
    import torch
    from django.contrib.auth.models import User

    from workers.models.demo import demo_model_build

    torch.set_num_threads(1)
    demo = demo_model_build(out=DEMO_DIR, progress=False, log=lambda _: None).out
    owner, _ = User.objects.get_or_create(username="bench-learning")
    results: Results = {}
    loads: list[float] = []
    try:
        for seed in seeds:
            for algorithm in algorithms:
                print(f"{algorithm} seed {seed}: {args.steps} steps", flush=True)
                results.setdefault(algorithm, {})[seed] = _run_one(
                    algorithm, steps=args.steps, eval_every=args.eval_every, demo=demo, owner=owner, lr=args.lr,
                    loss_type=args.loss_type, seed=seed)
                loads.append(os.getloadavg()[0])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return results, loads


def _in_processes(args: argparse.Namespace, *, seeds: list[int], algorithms: list[str]) -> tuple[Results, list[float]]:
    """Each (algorithm, seed) run in a child process of its own, `--jobs` at a time, in the
    order seed by seed (a seed's algorithms side by side see the same load)."""
    from workers.models.demo import demo_model_build

    setup_django()  # migrate once here: children migrating at the same time would race
    demo_model_build(out=DEMO_DIR, progress=False, log=lambda _: None)  # built once, before the children read it
    tmp = Path(tempfile.mkdtemp(prefix="rft-bench-learning-jobs-"))
    queue = [(algorithm, seed) for seed in seeds for algorithm in algorithms]
    running: list[tuple[str, int, Path, subprocess.Popen[bytes]]] = []
    results: Results = {}
    loads: list[float] = []
    try:
        while queue or running:
            while queue and len(running) < args.jobs:
                algorithm, seed = queue.pop(0)
                out = tmp / f"{algorithm}-{seed}.json"
                command = [sys.executable, "-m", "bench.learning", "--steps", str(args.steps), "--eval-every",
                           str(args.eval_every), "--algorithms", algorithm, "--seeds", str(seed), "--lr", str(args.lr),
                           "--loss-type", args.loss_type, "--out", str(out)]
                running.append((algorithm, seed, out, subprocess.Popen(command)))
            time.sleep(1)
            for entry in [e for e in running if e[3].poll() is not None]:
                running.remove(entry)
                algorithm, seed, out, child = entry
                if child.returncode != 0:
                    raise SystemExit(f"{algorithm} seed {seed} failed (exit {child.returncode})")
                data = json.loads(out.read_text())
                for name, by_seed in data["results"].items():
                    for key, points in by_seed.items():
                        results.setdefault(name, {})[int(key)] = [(int(a), float(b), float(c)) for a, b, c in points]
                loads.extend(data["loads"])
    finally:
        for *_, child in running:
            child.kill()
        shutil.rmtree(tmp, ignore_errors=True)
    # The tables list algorithms and seeds in the order asked, whichever child ended first.
    ordered = {a: {s: results[a][s] for s in seeds} for a in algorithms}
    return ordered, loads


def _report(results: Results, *, loads: list[float], seeds: list[int], steps: int) -> None:
    print()
    print(f"{'algorithm':<10}{'seed':>5}{'step':>6}{'seconds':>10}{'accuracy':>10}{'gain (pts)':>12}")
    for algorithm, by_seed in results.items():
        for seed, points in by_seed.items():
            base = points[0][2]
            for step, seconds, acc in points:
                print(f"{algorithm:<10}{seed:>5}{step:>6}{seconds:>10.1f}{acc:>10.3f}{100 * (acc - base):>+12.1f}")
    print()
    print(f"median over seeds {seeds} (spread: min..max)")
    print(f"{'algorithm':<10}{'step':>6}{'seconds':>10}{'gain (pts)':>12}{'spread':>16}")
    for algorithm, by_seed in results.items():
        curves = list(by_seed.values())
        for i, (step, _, _) in enumerate(curves[0]):
            gains = [100 * (c[i][2] - c[0][2]) for c in curves]
            secs = [c[i][1] for c in curves]
            print(f"{algorithm:<10}{step:>6}{median(secs):>10.1f}{median(gains):>+12.1f}"
                  f"{f'{min(gains):+.1f}..{max(gains):+.1f}':>16}")
    summary = []
    if "grpo" in results:
        within = [_gain_within(points, 600) for points in results["grpo"].values()]
        gains = [g for g, _ in within]
        summary.append(f"grpo median best gain within 10 min {median(gains):+.1f} pts (seeds {', '.join(f'{g:+.1f}' for g in gains)}; "
                       f"ratio to target 20 pts: {median(gains) / 20:.2f})")
    if "grpo" in results and "mix" in results:
        pairs = [(results["mix"][s][-1], results["grpo"][s][-1], results["grpo"][s][0][2]) for s in seeds]
        mix_gains = [100 * (m[2] - base) for m, _, base in pairs]
        grpo_gains = [100 * (g[2] - base) for _, g, base in pairs]
        summary.append(f"mix vs grpo gain at step {steps}: median {median(mix_gains):+.1f} vs {median(grpo_gains):+.1f} pts "
                       f"(mix - grpo per seed: {', '.join(f'{m - g:+.1f}' for m, g in zip(mix_gains, grpo_gains))}; "
                       "target mix >= grpo)")
    summary.append(f"load average (1 min) after each run: {', '.join(f'{x:.1f}' for x in loads)}")
    print("; ".join(summary))


if __name__ == "__main__":
    main()
