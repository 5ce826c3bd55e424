"""Our trainer step against a bare TRL step on the same batches. Target: ≤ 1.10×.

Baseline: a GRPOTrainer's `compute_loss` on a ready-made inputs dict, backward, gradient
clipping, optimizer step: what a hand-written loop around TRL costs at least.

Ours, two ways:
- the learner step (`workers.algorithms.Learner.step`): experiences → advantages, padding,
  π_old, TRL's loss, backward, clip, step, metrics;
- the whole task body (`workers.trainer.step.trainer_step`) against Postgres: readiness check,
  claim under a lease, the learner step, the trainer-state checkpoint, ack, metrics.

Prints a table and, on the last line, the whole-step ratio against the baseline.

    python -m bench.trainer_overhead [--steps 20] [--hidden 256] [--layers 4] [--batch 32] [--breakdown]

--breakdown also times the parts of the task body (medians per step) to show where the
difference to the learner step goes.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

from bench.common import median, setup_django

# The parts of `trainer_step` that --breakdown times: (module, [class.]attribute, label).
PARTS = [
    ("apps.control.conductor", "train_readiness", "readiness check"),
    ("workers.trainer.step", "resident_for", "resident lookup"),
    ("workers.trainer.step", "train_batch_claim", "claim (lease + decode)"),
    ("workers.algorithms.learner", "Learner.step", "learner step"),
    ("workers.trainer.step", "journal_encode", "journal encode"),
    ("workers.trainer.step", "journal_store", "journal write + fsync (background)"),
    ("apps.buffer.services", "batch_ack", "ack (in the commit)"),
    ("workers.trainer.step", "snapshot_and_prune", "snapshot + prune (every N steps)"),
    ("workers.trainer.step", "publish_due", "publish check"),
    ("apps.runs.services", "metric_record", "metric record"),
    ("apps.control.conductor", "run_advance", "run_advance (dispatch)"),
]


class Breakdown:
    """Wraps PARTS with timers that count only while `active` (the task body's calls)."""

    def __init__(self) -> None:
        self.active = False
        self.current: dict[str, float] = {}
        self.steps: list[dict[str, float]] = []

    def install(self) -> None:
        import functools
        import importlib

        for module_name, attr, label in PARTS:
            owner = importlib.import_module(module_name)
            *path, attr = attr.split(".")
            for name in path:
                owner = getattr(owner, name)
            original = getattr(owner, attr)

            def timed(*a, __original=original, __label=label, **kw):  # type: ignore[no-untyped-def]
                if not self.active:
                    return __original(*a, **kw)
                t0 = time.perf_counter()
                try:
                    return __original(*a, **kw)
                finally:
                    self.current[__label] = self.current.get(__label, 0.0) + time.perf_counter() - t0

            setattr(owner, attr, functools.wraps(original)(timed))

    def start(self) -> None:
        self.current = {}
        self.active = True

    def stop(self, total: float) -> None:
        self.active = False
        # Background parts overlap the others: they are not part of the sum.
        self.current["(rest: lock, run load, commit, …)"] = total - sum(
            v for k, v in self.current.items() if "background" not in k
        )
        self.steps.append(self.current)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--response", type=int, default=48)
    parser.add_argument("--breakdown", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    tmp = Path(tempfile.mkdtemp(prefix="rft-bench-trainer-"))
    os.environ["RFT_STORAGE_DIR"] = str(tmp / "storage")
    setup_django()

    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    from django.contrib.auth.models import User
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from apps.buffer.drafts import ExperienceDraft
    from apps.buffer.services import experience_write
    from apps.runs.models import Run
    from apps.runs.services import run_create
    from workers.trainer import step as step_module
    from workers.algorithms import Learner, LearnerSpec, Rollout, TrainBatch
    from workers.algorithms import trl_bridge as bridge
    from workers.algorithms.objectives import grpo
    from workers.models.tiny import tiny_model_save

    model_dir = tiny_model_save(tmp / "model", hidden_size=args.hidden, layers=args.layers, heads=4)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    probe = AutoModelForCausalLM.from_pretrained(model_dir)
    params_count = sum(p.numel() for p in probe.parameters())
    vocab = probe.config.vocab_size
    gen = torch.Generator().manual_seed(0)

    def batch_rollouts(step: int) -> list[Rollout]:
        rows = []
        for g in range(args.batch // args.group):
            prompt = torch.randint(10, vocab, (12,), generator=gen).tolist()
            for i in range(args.group):
                n = args.response - (i % 5) * 4
                rows.append(Rollout(
                    id=step * 10_000 + g * 100 + i, group_id=f"s{step}g{g}", prompt_ids=prompt,
                    completion_ids=torch.randint(10, vocab, (n,), generator=gen).tolist(),
                    logprobs=(-torch.rand(n, generator=gen) * 5).tolist(), reward=float((i * 7 + g) % 3),
                ))
        return rows

    batches = [batch_rollouts(s) for s in range(args.steps + 2)]
    params = bridge.TrainParams(learning_rate=1e-5, max_completion_length=args.response)
    from kernel.algorithms.grpo import GRPOParams

    settings = GRPOParams(loss_type="dapo")

    # -- baseline: bare TRL ------------------------------------------------------------
    base_model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    base_trainer = grpo.trainer_build(model=base_model, tokenizer=tokenizer, params=params, settings=settings)
    base_opt, _ = bridge.optimizer_build(trainer=base_trainer, total_steps=args.steps + 2)
    from workers.algorithms.batch import group_advantages

    ready_inputs = [
        grpo.inputs_build(
            trainer=base_trainer, prompt_ids=[r.prompt_ids for r in b], completion_ids=[r.completion_ids for r in b],
            old_logprobs=[r.logprobs or [] for r in b], advantages=group_advantages(b),  # the bench's rows all carry them
        )
        for b in batches
    ]

    def bare(inputs: dict[str, torch.Tensor]) -> None:
        base_opt.zero_grad(set_to_none=True)
        loss = base_trainer.compute_loss(base_model, inputs)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(base_model.parameters(), 1.0)
        base_opt.step()

    # -- ours: the learner -------------------------------------------------------------
    our_model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    learner = Learner(spec=LearnerSpec(algorithm="grpo", params=params, algorithm_params=settings), model=our_model,
                      tokenizer=tokenizer)

    # -- ours: the whole task body against Postgres ------------------------------------
    owner, _ = User.objects.get_or_create(username="bench-trainer")
    config = {"model": str(model_dir), "mode": "train", "algorithm": "grpo", "repeat_times": args.group,
              "train_batch_size": args.batch, "total_steps": args.steps + 2, "sync_interval": 10_000,
              "sampling": {"max_tokens": args.response},
              "trainer": {"loss_type": "dapo", "learning_rate": 1e-5}, "rewards": [{"name": "exact_match"}]}
    run = run_create(name="bench trainer overhead", owner=owner, config=config)
    Run.objects.filter(pk=run.pk).update(status=Run.Status.RUNNING)
    for s, b in enumerate(batches):
        experience_write(experiences=[
            ExperienceDraft(run_id=run.pk, key=f"{r.id}", group_id=r.group_id, token_ids=r.prompt_ids + r.completion_ids,
                            prompt_length=len(r.prompt_ids), logprobs=r.logprobs, reward=r.reward,
                            priority=float(len(batches) - s))
            for r in b
        ])

    # Warm-up: first calls allocate and load.
    bare(ready_inputs[0])
    learner.step(TrainBatch(usual=batches[0]))
    assert step_module.trainer_step(run_id=run.pk, step=1)["status"] == "trained"

    breakdown = Breakdown() if args.breakdown else None
    if breakdown is not None:
        breakdown.install()
    timings: dict[str, list[float]] = {"bare": [], "learner": [], "task": []}
    for s in range(1, args.steps + 1):
        # Interleaved so that load on a shared machine hits all three alike.
        t0 = time.perf_counter()
        bare(ready_inputs[s])
        timings["bare"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        learner.step(TrainBatch(usual=batches[s]))
        timings["learner"].append(time.perf_counter() - t0)
        if breakdown is not None:
            breakdown.start()
        t0 = time.perf_counter()
        out = step_module.trainer_step(run_id=run.pk, step=s + 1)
        timings["task"].append(time.perf_counter() - t0)
        if breakdown is not None:
            breakdown.stop(timings["task"][-1])
        assert out["status"] == "trained", out

    base = median(timings["bare"])
    base_mean = sum(timings["bare"]) / len(timings["bare"])
    print(f"model: {params_count / 1e6:.1f}M parameters, batch {args.batch} × ≤{args.response} tokens, {args.steps} steps")
    # Means count the snapshot steps (every RFT_TRAINER_SNAPSHOT_STEPS) that medians skip.
    print(f"{'path':<44} {'median s':>9} {'ratio':>7} {'mean s':>9} {'ratio':>7}")
    for label, key in (("bare TRL compute_loss + optimizer step", "bare"), ("our learner step", "learner"),
                       ("our train_step (claim, step, state, ack)", "task")):
        m, avg = median(timings[key]), sum(timings[key]) / len(timings[key])
        print(f"{label:<44} {m:>9.4f} {m / base:>7.3f} {avg:>9.4f} {avg / base_mean:>7.3f}")
    if breakdown is not None:
        print(f"{'task body part (per step)':<44} {'median s':>9} {'mean s':>9} {'mean/bare':>9}")
        labels = [label for _, _, label in PARTS if any(label in b for b in breakdown.steps)]
        for label in labels + ["(rest: lock, run load, commit, …)"]:
            values = [b.get(label, 0.0) for b in breakdown.steps]
            mean = sum(values) / len(values)
            print(f"  {label:<42} {median(values):>9.4f} {mean:>9.4f} {mean / base_mean:>9.3f}")
    run.delete()
    shutil.rmtree(tmp, ignore_errors=True)
    task_mean = sum(timings["task"]) / len(timings["task"])
    print(f"trainer_overhead ratio (our train_step / bare TRL step): {median(timings['task']) / base:.3f} median, "
          f"{task_mean / base_mean:.3f} mean (target <= 1.10)")


if __name__ == "__main__":
    main()
