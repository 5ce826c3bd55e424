"""Held-out accuracy against wall-clock on the demo task: GRPO, MIX (GRPO plus expert
corrections) and SFT alone on the same corrections.

The loop runs in this process, step by step, through the real code: `workers.explorer.explore`
samples and scores (math_accuracy + 0.1 × math_format) into the Postgres buffer, and
`workers.trainer.trainer_step` claims the batch, steps TRL's loss, saves and publishes the
version the next explore step loads. No Celery (so the clock measures the loop, not queue
latency). Expert corrections are written as the annotation UI writes a human correction
(`feedback_edit`'s row: text only, `is_expert`, source human, reward 1) through
`experience_write`, the right answer for the next tasks of the taskset, before the clock starts.

Accuracy is greedy `<answer>` accuracy on the demo model's 200 held-out problems (never in
the taskset), of each published version, measured off the clock.

    python -m bench.learning [--steps 500] [--eval-every 50] [--algorithms grpo,mix,sft]

Targets: GRPO ≥ +20 points within 10 minutes; MIX ≥ GRPO at equal steps. The last line
prints both ratios.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import ROOT, setup_django

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


def _config(algorithm: str, *, model: str, steps: int, lr: float = 1e-4, loss_type: str = "grpo") -> dict[str, Any]:
    trainer: dict[str, Any] = {"learning_rate": lr, "loss_type": loss_type}
    if algorithm == "grpo":
        return {**COMMON, "model": model, "algorithm": "grpo", "mode": "sync", "total_steps": steps,
                "train_batch_size": TASKS_PER_STEP * REPEAT, "epochs": -(-steps * TASKS_PER_STEP // 256),
                "trainer": trainer}
    if algorithm == "mix":
        size = TASKS_PER_STEP * REPEAT + EXPERT_PER_STEP
        return {**COMMON, "model": model, "algorithm": "mix", "mode": "sync", "total_steps": steps,
                "train_batch_size": size, "epochs": -(-steps * TASKS_PER_STEP // 256),
                "trainer": {**trainer, "mu": 0.2, "expert_share": EXPERT_PER_STEP / size}}
    if algorithm == "sft":
        return {**COMMON, "model": model, "algorithm": "sft", "mode": "train", "total_steps": steps,
                "train_batch_size": EXPERT_PER_STEP, "trainer": trainer}
    raise SystemExit(f"unknown algorithm {algorithm!r}")


def _corrections_write(*, run: Any, taskset: Any, count: int) -> None:
    """Human corrections as `feedback_edit` writes them: text only (no tokens), expert."""
    from apps.buffer.drafts import ExperienceDraft
    from apps.buffer.models import Experience
    from apps.buffer.services import experience_write
    from apps.rewards.registry import reference_text

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

    from workers.demo_model import DemoSettings, _problems, greedy_accuracy

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)  # the reloaded one, as engines see it
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return greedy_accuracy(model=model, tokenizer=tokenizer, problems=_problems(DemoSettings())[1])


def _run_one(algorithm: str, *, steps: int, eval_every: int, demo: Path, owner: Any, lr: float,
             loss_type: str) -> list[tuple[int, float, float]]:
    """[(step, training seconds so far, held-out accuracy)], step 0 being the base model."""
    from apps.buffer.importers import taskset_import
    from apps.buffer.services import task_attempts_create
    from apps.runs.models import ModelVersion, Run
    from apps.runs.services import run_create
    from workers.demo_model import TASKSET_FILE
    from workers.explorer import explore
    from workers.trainer import trainer_step

    taskset = taskset_import(name=f"demo {algorithm}", path=demo / TASKSET_FILE, owner=owner)
    run = run_create(name=f"bench learning {algorithm}", owner=owner, config=_config(algorithm, model=str(demo), steps=steps, lr=lr, loss_type=loss_type),
                     taskset=taskset)
    if algorithm in ("mix", "sft"):
        _corrections_write(run=run, taskset=taskset, count=steps * EXPERT_PER_STEP)
    # Running without the conductor: this process is the conductor.
    Run.objects.filter(pk=run.pk).update(status=Run.Status.RUNNING)
    explores = algorithm != "sft"
    if explores:
        for epoch in range(run.cfg.epochs):
            task_attempts_create(run=run, epoch=epoch)
    base = _accuracy(str(demo), demo)
    points = [(0, 0.0, base)]
    clock = 0.0
    for step in range(1, steps + 1):
        started = time.perf_counter()
        if explores:
            summary = explore(run_id=run.pk, step=step, worker="bench-explorer")
            if not summary.get("tasks"):
                raise SystemExit(f"{algorithm}: explore step {step} found no tasks: {summary}")
        result = trainer_step(run_id=run.pk, step=step, worker="bench-trainer")
        clock += time.perf_counter() - started
        if result.get("status") != "trained":
            raise SystemExit(f"{algorithm}: train step {step}: {result}")
        if step % eval_every == 0 or step == steps:
            # The version published at this step (sync_interval is 1: every step publishes).
            checkpoint = ModelVersion.objects.get(run=run, train_step=step).checkpoint
            points.append((step, clock, _accuracy(checkpoint, demo)))
            print(f"  {algorithm} step {step:4d}  {clock:7.1f} s  acc {points[-1][2]:.3f}", flush=True)
    return points


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--eval-every", type=int, default=50)
    parser.add_argument("--algorithms", default="grpo,mix,sft")
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--loss-type", default="grpo")
    args = parser.parse_args()
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

    from workers.demo_model import demo_model_build

    torch.set_num_threads(1)
    demo = demo_model_build(out=ROOT / ".cache" / "demo-model", progress=False, log=lambda _: None).out
    owner, _ = User.objects.get_or_create(username="bench-learning")
    results: dict[str, list[tuple[int, float, float]]] = {}
    try:
        for algorithm in args.algorithms.split(","):
            print(f"{algorithm}: {args.steps} steps", flush=True)
            results[algorithm] = _run_one(algorithm, steps=args.steps, eval_every=args.eval_every, demo=demo, owner=owner,
                                          lr=args.lr, loss_type=args.loss_type)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    print()
    print(f"{'algorithm':<10}{'step':>6}{'seconds':>10}{'accuracy':>10}{'gain (pts)':>12}")
    for algorithm, points in results.items():
        base = points[0][2]
        for step, seconds, acc in points:
            print(f"{algorithm:<10}{step:>6}{seconds:>10.1f}{acc:>10.3f}{100 * (acc - base):>+12.1f}")
    summary = []
    if "grpo" in results:
        g = results["grpo"]
        best = max((p for p in g if p[1] <= 600), key=lambda p: p[2])
        summary.append(f"grpo gain within 10 min {100 * (best[2] - g[0][2]):+.1f} pts at {best[1]:.0f} s "
                       f"(ratio to target 20 pts: {(best[2] - g[0][2]) * 100 / 20:.2f})")
    if "grpo" in results and "mix" in results:
        g, m = results["grpo"][-1], results["mix"][-1]
        base = results["grpo"][0][2]
        ratio = (m[2] - base) / (g[2] - base) if g[2] > base else float("inf")
        summary.append(f"mix/grpo gain at step {g[0]}: {ratio:.2f} (acc {m[2]:.3f} vs {g[2]:.3f}; target >= 1.00)")
    print("; ".join(summary))


if __name__ == "__main__":
    main()
