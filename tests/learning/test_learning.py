"""Learning through the whole loop: the conductor, the explorer and the trainer as real
Celery workers on Postgres and Redis, GRPO on the demo task, and the model gets better.

Accuracy is measured on the demo model's fixed held-out problems (never in the taskset)
with plain transformers on the base model and on the run's last published checkpoint: the
expected accuracy at temperature 1 (the probability of sampling the right answer, what
GRPO raises; the test's bar) and greedy `<answer>` accuracy (which must not fall).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from apps.control.demo import demo_taskset_import
from apps.runs.models import Run
from apps.runs.services import run_transition
from bench.common import run_wait_ended
from tests.factories import make_run

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

STEPS = 60
TASKS_PER_STEP = 16
# Expected held-out accuracy gain the run must reach (see the note above the test).
BAR_EXPECTED = 0.02

# Settings chosen for a steady gain in a few minutes on 2 CPU cores: one-step-off sync so the
# explorer and the trainer overlap, groups of 8 at temperature 1 so most groups have a reward
# spread, and a learning rate well below where this small model's policy collapses (1e-3
# collapses it within 5 steps; 3e-4 wanders below the base; 1e-4 climbs steadily).
LEARNING_CONFIG: dict[str, Any] = {
    "algorithm": "grpo",
    "mode": "sync",
    "engine": "transformers",
    "sync_interval": 1,
    "sync_offset": 1,
    "explore_batch_size": TASKS_PER_STEP,
    "repeat_times": 8,
    "train_batch_size": TASKS_PER_STEP * 8,
    "total_steps": STEPS,
    # 256 demo tasks / 16 per step: an epoch is 16 steps; give the run tasks for every step.
    "epochs": -(-STEPS * TASKS_PER_STEP // 256),
    "sampling": {"temperature": 1.0, "max_tokens": 12},
    "rewards": [{"name": "math_accuracy"}, {"name": "math_format", "weight": 0.1}],
    "trainer": {"learning_rate": 1e-4, "loss_type": "grpo"},
}


def heldout_accuracy(model_dir: str | Path) -> tuple[float, float]:
    """(greedy accuracy, expected accuracy at temperature 1) on the held-out problems."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from workers.demo_model import DemoSettings, _problems, expected_accuracy, greedy_accuracy

    torch.set_num_threads(1)
    # The tokenizer as every engine reloads it (the in-memory one of modelkit encodes digits differently).
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    _, heldout, _ = _problems(DemoSettings())
    return (greedy_accuracy(model=model, tokenizer=tokenizer, problems=heldout),
            expected_accuracy(model=model, tokenizer=tokenizer, problems=heldout))


# Why the measure is the expected accuracy (round 6, measured on the RECIPE 4 demo model): the
# round-5 "regression" (+3.0 greedy points at 60 steps) is not in the loop. One identical
# 128-row batch through rftweb's Learner.step and through stock TRL GRPOTrainer's training step
# gives the same update (cosine 0.9991, max |diff| 1.9e-7), and the same 60 steps run as a
# bare loop (no database) gain +0.5, +1.0 and +6.5 greedy points for seeds 0, 1, 2 where
# stock TRL gains +8.0 and +4.5 for seeds 0, 1: greedy accuracy on 200 problems flips only
# when an answer's likeliest digit changes, and at this learning rate its gain after 60 steps
# is mostly the trajectory's luck. The probability of sampling the right answer, which GRPO
# raises, moves every step: seeds 0 and 1 of the bare loop, +0.5 and +1.0 greedy points at
# step 60, raise it from 0.144 to 0.186 and 0.197 (+4.2 and +5.3 points; 0.155 and 0.175 at
# step 20, 0.174 and 0.198 at step 40). An unchanged model scores the base exactly. This test,
# first run: greedy +10.0, expected +6.9 points in 346 s at load 15. (lr 3e-4 in the bare
# loop: greedy -7.5 and -14.0 points at step 20; the model is no more robust than that.)
def test_grpo_through_the_whole_loop_raises_heldout_accuracy_over_the_warm_up(
    owner: Any, demo_model_dir: Path, loop_workers: dict[str, Path]
) -> None:
    taskset = demo_taskset_import(owner=owner, model_dir=demo_model_dir)
    run = make_run(owner=owner, taskset=taskset, model=str(demo_model_dir), **LEARNING_CONFIG)
    started = time.monotonic()
    run_transition(run=run, action="start", actor=owner)
    # A cap, not a guess: it returns when the run ends (346 s at load 15 in round 6; the suite
    # beside other work has run at twice that time).
    run_wait_ended(run, seconds=1500, poll=1.0)
    seconds = time.monotonic() - started
    logs = {name: path.read_text(errors="replace")[-2000:] for name, path in loop_workers.items()}
    assert run.status == Run.Status.FINISHED, (run.status, run.error, run.train_step, run.explore_step, logs)
    assert run.train_step == STEPS and run.current_version == STEPS

    base, base_expected = heldout_accuracy(demo_model_dir)
    trained, trained_expected = heldout_accuracy(run.versions.get(number=run.current_version).checkpoint)
    print(f"\nheld-out accuracy after {STEPS} GRPO steps in {seconds:.0f} s: greedy {base:.3f} -> {trained:.3f} "
          f"({100 * (trained - base):+.1f} points), expected at temperature 1 {base_expected:.4f} -> "
          f"{trained_expected:.4f} ({100 * (trained_expected - base_expected):+.1f} points)")
    # An unchanged model scores the base exactly; BAR_EXPECTED is under half the smallest gain seen.
    assert trained_expected >= base_expected + BAR_EXPECTED, (
        f"GRPO did not raise the probability of the right answer: {base_expected:.4f} -> {trained_expected:.4f}")
    # Greedy accuracy is noisy at this length (see above): it must not have fallen.
    assert trained >= base - 0.03, f"greedy held-out accuracy fell: {base:.3f} -> {trained:.3f}"
