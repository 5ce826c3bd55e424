"""Peak memory per rank and seconds per step of the learner sharded over N processes with
FSDP2 (`trainer.sharding: full`, gloo on the CPU) against one process, on a Qwen2-shaped
model built as bench/trainer_memory builds its own (--size 350m by default: 28 layers, hidden
1024, 349M parameters; 100m: the ~100M model of the earlier rounds; saved as safetensors
once), the same GRPO batch, in the same run. Target: peak per rank ≤ 0.65× the one-process peak.

Measured at 350m (defaults, --repeat 3 --phases --version, two-core host shared with other
jobs, 2026-11-26 16:59-17:40 UTC, load 8-16): one process 6268-6269 MB whole-process peak
(914-916 MB of it the baseline), ranks 4108-4130 MB (baseline 906-907): 0.66x in all three
repeats (0.60x above the baseline); not met by 0.01 (4075 MB would be). A rank's tensors at its
peak (step 2's backward) are exactly half of one process's (666 + 666 + 1332 = 2664 MB against
5329); above them it holds ~350 MB at the backward's end that stay through the optimizer step
(one process ~25): after step 1 it is ~40, so it is the second step's, most likely heap
fragments of the half batch's sub-1 MB activations and of the sharded gradients under the 1 MB
mmap threshold (see workers/host_memory.py); the peak adds ~190 MB more inside the backward.
With --mmap-threshold 262144 (one repeat, load 3.4-4.4): ranks 3815-3818 MB against 6266, 0.61x
(0.54x above the baseline), a rank's second backward ending 53 MB above its tensors; its step
1.6x one process's (bench/README.md, Sharding).
At the product's rule (a rank's threshold the setting / ranks: 512 KB on 2; --repeat 1
--phases three times, in turn with the commit before, 2026-11-26 20:20-21:10 UTC, load 2-25):
ranks 3662-3665 MB against 6112, 0.60x in all three (0.54x above the baseline), against
3959-3969 (0.65x, 0.60x) at 1 MB; a rank's second backward ends 51-53 MB above its tensors
(346-358 at 1 MB). A rank's step at load 2-3: 13.0 s, 11.7 CPU-s, against 12.6 s, 11.3 CPU-s
at 1 MB (+3-4%).
--version: writing a version adds 64 MB on each rank when streamed from the shards
(`whole_write`, as the train worker's gang now does), against 1105-1112 MB on rank 0 gathered
whole (`whole_gather`, before: held until the next step, it would have put rank 0 at ~4.4 GB,
0.70x); one process's save_pretrained added nothing above its RSS.

Each setting runs in its own processes. As in bench/trainer_memory, every process first
builds and steps a 2-layer, 64-wide learner (sharded too, for the ranks), so what TRL,
transformers and torch.distributed set up once is in its baseline. Then it loads the
model as a run does: one process whole (transformers' from_pretrained), each rank only its
shard (workers.algorithms.sharding.model_sharded_load: built on the meta device, sharded,
its rows read from the file). Memory is the whole process's RSS high-water mark (VmHWM),
the imports, the warm-up and the load included ("peak MB"), against the one process's;
"load pk" is that mark once the model is loaded, "held" what the built learner holds
above the baseline, and the line under the table gives the ratio above the baseline too.
"mmap KB": each process's glibc mmap threshold, --mmap-threshold (1 MB) in the one process
and the product's rule in a rank (workers.host_memory.rank_mmap_threshold: scaled by its
share, 512 KB on 2 ranks), as a CPU train worker and its followers set it from
RFT_TRAINER_CPU_MMAP_THRESHOLD.
On a CUDA host (--device cuda) memory is the allocator's peak instead.

The ranks share the host's cores: each gets --threads / ranks threads, so the step times
compare the same CPU budget (a gang on N hosts or GPUs gets N times the compute).

At 100m (--size 100m; the default until round 49), measured (--steps 2, two-core host
shared with other jobs, load 15-23, 2026-11-26): one process 2367 MB whole-process peak (817 MB of it the baseline: imports and
warm-up; its load peak 840 MB, transformers maps the file and faults weights in as used),
ranks 1853-1855 MB (baseline 811-812; load peak 1029: its ~200 MB shard): 0.78x whole
process, 0.67x above the baseline. The baseline (~0.8 GB) is most of what keeps the
whole-process ratio from 0.65 on a ~100M model: it is the same in every process and shrinks
beside the model as the model grows (on a 7B model it is ~1%).

Again with --phases --repeat 3 (2026-11-26, load 11-42): 0.78x in all three (0.67x above the
baseline); a rank's weights, gradients and AdamW state are exactly half of one process's (768 MB
against 1536), and its peak adds ~275 MB of activations and the gathered last unit that one
process's peak, after its activations are freed, does not (bench/README.md, Sharding).

Before (the peak reset once the learner was built, so not counting the load; every rank
built the whole model first): Measured (defaults, --steps 3, two-core host shared with other jobs, 2026-11-25): one
process 1552 MB, ranks 958-961 MB: 0.62× in each of three runs (load 7-39; the step times,
0.36-1.79× one process, are the load's, not the gang's). Before the heap trim after each
block's backward (workers/host_memory.py) 1585 MB against 1032-1037 MB, 0.65× (load
0.3-0.6; 0.70× before the output head was grouped with the last block): a rank's half of
the batch has activations under the 1 MB mmap threshold, which the backward freed into the
heap, and they stayed resident (~120 MB) through the peak. What a rank's peak (step 2 on,
in the backward after the last block's) is made of now, --phases: ~585 MB its shards
of the weights (~200) and of AdamW's moments (~400), ~175 MB of
activations, the gradients' shards as the backward reduces them, and the last block's unit
(output head included, 75 MB) gathered with its whole gradients and reduce-scatter buffer;
the forward peaks at ~920 MB (that unit gathered on top of the activations). The trim costs
step time (the trimmed pages fault in again): 2 ranks, 3 steps, trim and no trim in turn
(load 7.3-8.5), 10.6-11.3 s a step with it against 8.9-9.9 s without, peaks 958-960 MB
against 1068-1080 MB.

    python -m bench.sharding [--ranks 2] [--size 350m|100m] [--layers N] [--hidden N] [--batch 4] [--steps 2]
                             [--repeat 3] [--phases]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import free_port
from bench.trainer_memory import bench_rollouts, bench_tokenizer, model_arguments, qwen2_learner

ROOT = Path(__file__).resolve().parent.parent

# --size: (layers, hidden, intermediate) of a Qwen2-shaped model (vocabulary --vocab, 4 KV
# heads, untied head). 350m is the default: beside it the ~0.8 GB every process has before
# the model (imports, the warm-up) weighs ~15% of one process's peak, against ~35% beside
# 100m, so the ratio measures the sharding. One process of 350m peaks at ~6.3 GB.
SIZES = {"100m": (12, 768, 2048), "350m": (28, 1024, 2816)}


def _rss_mb() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _peak_reset() -> None:
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")  # VmHWM := the current RSS


def _peak_mb() -> float:
    with open("/proc/self/status") as fh:
        line = next(l for l in fh if l.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024


def _one(args: argparse.Namespace, *, rank: int, world: int, port: int) -> dict[str, Any]:
    import torch

    from workers.algorithms import TrainBatch

    threads = max(1, args.threads // world)
    torch.set_num_threads(threads)
    cuda = args.device == "cuda"
    threshold = 0
    if args.mmap_threshold and not cuda:
        from workers.host_memory import cpu_allocator_tune, rank_mmap_threshold

        # What a train worker and its followers do with RFT_TRAINER_CPU_MMAP_THRESHOLD set:
        # one process uses it, a rank the product's rule (its share of the batch and gradients).
        threshold = rank_mmap_threshold(args.mmap_threshold, world=world)
        cpu_allocator_tune(threshold=threshold)
    shard: Any = None
    if world > 1:
        import torch.distributed as dist

        if cuda:
            torch.cuda.set_device(rank)
        dist.init_process_group("cpu:gloo,cuda:nccl" if cuda else "gloo", init_method=f"tcp://127.0.0.1:{port}",
                                world_size=world, rank=rank)
    from workers.algorithms.sharding import learner_shard

    tokenizer = bench_tokenizer()
    rollouts = bench_rollouts(args)
    imports, imports_load = _rss_mb(), os.getloadavg()[0]

    def build(layers: int, hidden: int, intermediate: int) -> tuple[Any, Any, int]:
        learner, params = qwen2_learner(args, tokenizer, layers=layers, hidden=hidden, intermediate=intermediate)
        part = learner_shard(learner, rank=rank, world=world, sharding=args.sharding) if world > 1 else None
        return learner, part, params

    warm, warm_shard, _ = build(2, 64, 128)
    warm.step(TrainBatch(usual=rollouts[:4]), shard=warm_shard)
    del warm, warm_shard
    gc.collect()
    base = _rss_mb()
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    learner, shard = _load(args, rank=rank, world=world, tokenizer=tokenizer)
    params = sum(p.numel() for p in learner.model.parameters()) if world == 1 else 0
    gc.collect()
    held = _rss_mb() - base
    load_peak = _peak_mb()
    loaded = {"tensors": _tensors_mb(learner), "load avg": os.getloadavg()[0]}
    phases = _phases_probe(learner, base) if args.phases and not cuda else None
    seconds = []
    cpu_seconds = []
    overall = 0.0
    for _ in range(args.steps):
        started, cpu_started = time.perf_counter(), time.process_time()
        learner.step(TrainBatch(usual=rollouts), shard=shard)
        if cuda:
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - started)
        # The process's CPU time (all its threads, the kernel's share included): on a shared
        # host the wall time is mostly the other jobs', this is the step's own cost.
        cpu_seconds.append(time.process_time() - cpu_started)
        if phases is not None:
            phases.mark("optimizer step")
            overall = max(overall, phases.overall)
    # The whole process's high-water mark, the load included (--phases resets the kernel's
    # mark at each phase's end; the phases keep what each reset would lose).
    peak = max(load_peak, base + overall, _peak_mb())
    if cuda:
        peak = torch.cuda.max_memory_allocated() / 2**20
    version = _version_probe(learner, world=world) if args.version and not cuda else {}
    if world > 1:
        import torch.distributed as dist

        dist.destroy_process_group()
    return {"params": params, "peak_mb": peak, "load_peak_mb": load_peak if not cuda else 0.0, "held_mb": held,
            "base_mb": base, "step_seconds": min(seconds[1:] or seconds),
            "step_cpu_seconds": min(cpu_seconds[1:] or cpu_seconds), "threads": threads, "mmap_kb": threshold // 1024,
            "imports_mb": imports, "imports_load": imports_load, "loaded": loaded,
            "phases": phases.rows if phases is not None else [], "version": version}


def _version_probe(learner: Any, *, world: int) -> dict[str, float]:
    """What writing a full-weight version adds to the process's RSS (MB above the RSS
    before it, its own high-water mark): one process saves its model (save_pretrained, as
    CheckpointSync); a gang writes it from the shards one tensor at a time (`whole_write`,
    as a train worker's gang does now) and, before, gathered it whole on rank 0
    (`whole_gather`, kept until the next step)."""
    from workers.algorithms.sharding import whole_gather, whole_write

    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="bench-sharding-version-") as tmp:
        gc.collect()
        _peak_reset()
        start = _rss_mb()
        if world == 1:
            learner.model.save_pretrained(tmp, safe_serialization=True)
            out["saved"] = _peak_mb() - start
            return out
        whole_write(learner, Path(tmp) / "model.safetensors")
        out["streamed"] = _peak_mb() - start
        gc.collect()
        _peak_reset()
        start = _rss_mb()
        state = whole_gather(learner)
        out["gathered"] = _peak_mb() - start
        del state
    return out


def _tensors_mb(learner: Any) -> dict[str, float]:
    """This process's part of the learner's tensors, counted exactly (MB): its weights (its
    shards in a gang), their gradients and the optimizer's state (AdamW's moments)."""
    import torch

    def mb(tensors: Any) -> float:
        total = 0
        for t in tensors:
            local = t.to_local() if hasattr(t, "to_local") else t
            total += local.numel() * local.element_size()
        return round(total / 2**20, 1)

    params = list(learner.model.parameters())
    state = [v for s in learner.optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    return {"weights": mb(params), "grads": mb(p.grad for p in params if p.grad is not None), "optimizer": mb(state)}


def _load(args: argparse.Namespace, *, rank: int, world: int, tokenizer: Any) -> tuple[Any, Any]:
    """(the learner on the saved model, its shard or None): one process loads it whole
    (transformers' from_pretrained), a rank only its shard (model_sharded_load)."""
    import torch

    from workers.algorithms import Learner, LearnerSpec
    from workers.algorithms import trl_bridge as bridge
    from workers.algorithms.sharding import learner_shard, model_sharded_load

    spec = LearnerSpec(algorithm="grpo", params=bridge.TrainParams(learning_rate=1e-5,
                                                                   max_completion_length=args.completion),
                       algorithm_params={"loss_type": "grpo"})
    torch.manual_seed(0)
    if world == 1:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32).to(args.device)
        return Learner(spec=spec, model=model, tokenizer=tokenizer), None
    if args.sharding == "none":
        sys.exit("--sharding none replicates the whole model on every rank: nothing to load sharded")
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(args.device, (world,))
    model = model_sharded_load(args.model_dir, mesh=mesh, reshard=args.sharding == "full", precision="fp32")
    learner = Learner(spec=spec, model=model, tokenizer=tokenizer)
    return learner, learner_shard(learner, rank=rank, world=world, sharding=args.sharding)


def _model_save(args: argparse.Namespace, path: Path) -> int:
    """The bench's model (bench/trainer_memory's, random weights) saved at `path` as
    safetensors, as a run's model is; returns its parameter count."""
    learner, params = qwen2_learner(argparse.Namespace(**{**vars(args), "device": "cpu"}), bench_tokenizer(),
                                    layers=args.layers, hidden=args.hidden, intermediate=args.intermediate)
    learner.model.save_pretrained(path, safe_serialization=True)
    return params


class _Phases:
    """Per phase of each step, the peak RSS within it and the RSS at its end (MB above the
    baseline): the peak is read and reset (/proc/self/clear_refs) at each phase's end, so
    `overall` keeps the step's peak across the resets."""

    def __init__(self, base: float, learner: Any) -> None:
        self.base = base
        self.learner = learner
        self.rows: list[list[Any]] = []
        self.overall = 0.0
        self.step = 1

    def mark(self, phase: str) -> None:
        peak, now = _peak_mb() - self.base, _rss_mb() - self.base
        self.overall = max(self.overall, peak)
        tensors = _tensors_mb(self.learner)
        self.rows.append([self.step, phase, round(peak), round(now), tensors["weights"], tensors["grads"],
                          tensors["optimizer"], round(os.getloadavg()[0], 2)])
        if phase == "optimizer step":
            self.step += 1
        _peak_reset()


def _phases_probe(learner: Any, base: float) -> _Phases:
    """Phase ends: the policy's forward (its loss), the backward and gradient clipping
    (the optimizer's pre-step hook), the optimizer's step (after `learner.step`)."""
    phases = _Phases(base, learner)
    learner.model.register_forward_hook(lambda *_: phases.mark("forward"))
    learner.optimizer.register_step_pre_hook(lambda *_: phases.mark("backward + clip"))
    return phases


def _run(args: argparse.Namespace, world: int, env: dict[str, str], model_dir: str) -> list[dict[str, Any]]:
    port = free_port()
    argv = [*sys.argv[1:], "--model-dir", model_dir]
    procs = [subprocess.Popen([sys.executable, "-m", "bench.sharding", "--rank", str(r), "--world", str(world),
                               "--port", str(port), *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=env, cwd=ROOT) for r in range(world)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=args.timeout)
        line = next((l for l in out.splitlines() if l.startswith("RESULT ")), None)
        if p.returncode or line is None:
            for q in procs:
                q.kill()
            sys.exit(f"a {world}-process setting failed:\n{err[-3000:]}")
        results.append(json.loads(line.removeprefix("RESULT ")))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--sharding", choices=["full", "grad_op", "none"], default="full")
    model_arguments(parser)
    parser.add_argument("--size", choices=sorted(SIZES), default="350m",
                        help="the model's shape (layers, hidden, intermediate); --layers, --hidden and "
                             "--intermediate override its parts")
    parser.set_defaults(layers=None, hidden=None, intermediate=None)
    parser.add_argument("--threads", type=int, default=2, help="threads of the one process; each rank gets threads / ranks")
    parser.add_argument("--mmap-threshold", type=int, default=1 << 20,
                        help="RFT_TRAINER_CPU_MMAP_THRESHOLD: the one process's glibc mmap threshold, a rank's "
                             "scaled by the product's rule (workers.host_memory.rank_mmap_threshold; 0: glibc's default)")
    parser.add_argument("--timeout", type=float, default=3600.0)
    parser.add_argument("--repeat", type=int, default=1, help="run the comparison this many times (the spread is printed)")
    parser.add_argument("--version", action="store_true",
                        help="after the steps, also measure what writing a full-weight version adds (each process)")
    parser.add_argument("--phases", action="store_true",
                        help="also print each step's peak and end RSS per phase (forward, backward + clip, optimizer)")
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--world", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    for key, value in zip(("layers", "hidden", "intermediate"), SIZES[args.size]):
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.rank is not None:
        print("RESULT " + json.dumps(_one(args, rank=args.rank, world=args.world, port=args.port)), flush=True)
        return

    path = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    env = {**os.environ, "PYTHONPATH": path, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "OMP_NUM_THREADS": str(args.threads)}
    ratios: list[tuple[float, float, float]] = []
    with tempfile.TemporaryDirectory(prefix="bench-sharding-") as tmp:
        params = _model_save(args, Path(tmp))
        for i in range(args.repeat):
            if args.repeat > 1:
                print(f"\n=== repeat {i + 1} of {args.repeat} ===", flush=True)
            load_one, one, load_gang, ranks = _settings(args, env, tmp)
            one["params"] = params
            ratios.append((*_report(args, load_one, one, load_gang, ranks), load_gang))
    if args.repeat > 1:
        whole, above, loads = zip(*ratios)
        print(f"\nover {args.repeat} repeats: peak per rank / one process {min(whole):.2f}-{max(whole):.2f} "
              f"(above base {min(above):.2f}-{max(above):.2f}), load average {min(loads):.2f}-{max(loads):.2f}")


def _settings(args: argparse.Namespace, env: dict[str, str], model_dir: str
              ) -> tuple[float, dict[str, Any], float, list[dict[str, Any]]]:
    load_one = os.getloadavg()[0]
    one = _run(args, 1, env, model_dir)[0]
    print(f"  done: one process (load average {load_one:.2f})", flush=True)
    load_gang = os.getloadavg()[0]
    ranks = _run(args, args.ranks, env, model_dir)
    print(f"  done: {args.ranks} ranks {args.sharding} (load average {load_gang:.2f})", flush=True)
    return load_one, one, load_gang, ranks


def _report(args: argparse.Namespace, load_one: float, one: dict[str, Any], load_gang: float,
            ranks: list[dict[str, Any]]) -> tuple[float, float]:
    """Print one comparison; returns (peak per rank / one process, the same above the baseline)."""

    print(f"\nmodel: {one['params'] / 1e6:.1f}M parameters (Qwen2, {args.layers} layers, hidden {args.hidden}); "
          f"batch {args.batch} × ({args.prompt} + {args.completion}) tokens; GRPO step, full fine-tuning fp32 AdamW; "
          f"device {args.device}")
    print(f"{'setting':<22}{'base MB':>9}{'held MB':>9}{'load pk':>9}{'peak MB':>9}{'× one':>7}{'step s':>8}"
          f"{'× one':>7}{'cpu s':>8}{'threads':>8}{'mmap KB':>8}{'load':>7}")
    for name, res, load in [("one process", one, load_one),
                            *((f"rank {r} of {args.ranks} ({args.sharding})", res, load_gang) for r, res in enumerate(ranks))]:
        print(f"{name:<22}{res['base_mb']:>9.0f}{res['held_mb']:>9.0f}{res['load_peak_mb']:>9.0f}{res['peak_mb']:>9.0f}"
              f"{res['peak_mb'] / one['peak_mb']:>7.2f}{res['step_seconds']:>8.2f}"
              f"{res['step_seconds'] / one['step_seconds']:>7.2f}{res.get('step_cpu_seconds', 0.0):>8.2f}{res['threads']:>8}{res['mmap_kb']:>8}{load:>7.2f}")
    above = max(r["peak_mb"] - r["base_mb"] for r in ranks) / (one["peak_mb"] - one["base_mb"])
    print(f"(base: the process before the model, imports and warm-up included; held: the learner built, above "
          f"base; load pk and peak: the whole process's RSS high-water mark after the load and after the steps. "
          f"Above base, peak per rank / one process: {above:.2f})")
    if args.phases:
        _phases_report(args, one, ranks)
    _where_report(args, one, ranks, load_one, load_gang)
    if args.version:
        print("\nversion written after the steps (MB of RSS above the RSS before it): one process saves its model; "
              "a rank streams it from the shards (whole_write), or gathers it whole (whole_gather, before)")
        for name, res in [("one process", one), *((f"rank {r} of {args.ranks}", res) for r, res in enumerate(ranks))]:
            print(f"  {name:<20}" + "  ".join(f"{k} {v:.0f}" for k, v in res["version"].items()))
    ratio = max(r["peak_mb"] for r in ranks) / one["peak_mb"]
    print(f"\nsharding peak per rank / one process: {ratio:.2f} (target <= 0.65: {'met' if ratio <= 0.65 else 'NOT met'}); "
          f"step {ranks[0]['step_seconds'] / one['step_seconds']:.2f}× one process; load average now {os.getloadavg()[0]:.2f}")
    return ratio, above


def _phases_report(args: argparse.Namespace, one: dict[str, Any], ranks: list[dict[str, Any]]) -> None:
    """Per phase of each step: the peak within it and the RSS at its end (MB above base), with
    the weights, gradients and optimizer state held at its end (exact), and the load."""
    print(f"\n{'setting':<22}{'step':>5}  {'phase':<16}{'peak MB':>9}{'end MB':>8}{'weights':>9}{'grads':>8}"
          f"{'optim':>8}{'load':>7}")
    for name, res in [("one process", one), *((f"rank {r} of {args.ranks}", res) for r, res in enumerate(ranks))]:
        for step, phase, peak, end, weights, grads, optim, load in res["phases"]:
            print(f"{name:<22}{step:>5}  {phase:<16}{peak:>9}{end:>8}{weights:>9.0f}{grads:>8.0f}{optim:>8.0f}{load:>7.2f}")


def _where_report(args: argparse.Namespace, one: dict[str, Any], ranks: list[dict[str, Any]], load_one: float,
                  load_gang: float) -> None:
    """Where each process's memory goes (MB of RSS): the imports, the warm-up above them, the
    model's load above the baseline (its weights counted exactly), the steps' peak above the
    load; the load average beside each setting."""
    print(f"\n{'setting':<22}{'imports':>9}{'warm-up':>9}{'load':>7}{'weights':>9}{'steps':>7}{'peak':>7}"
          f"{'load@imp':>9}{'load@ld':>8}{'load':>7}")
    for name, res, load in [("one process", one, load_one),
                            *((f"rank {r} of {args.ranks}", res, load_gang) for r, res in enumerate(ranks))]:
        print(f"{name:<22}{res['imports_mb']:>9.0f}{res['base_mb'] - res['imports_mb']:>9.0f}"
              f"{res['load_peak_mb'] - res['base_mb']:>7.0f}{res['loaded']['tensors']['weights']:>9.0f}"
              f"{res['peak_mb'] - res['load_peak_mb']:>7.0f}{res['peak_mb']:>7.0f}{res['imports_load']:>9.2f}"
              f"{res['loaded']['load avg']:>8.2f}{load:>7.2f}")
    print("(imports: RSS once torch, TRL and the gang are set up; warm-up: the small learner's build and step "
          "above that; load: the load's high-water mark above the baseline, weights: the weights it holds, exactly; "
          "steps: the steps' high-water mark above the load's; load@…: the load average then)")


if __name__ == "__main__":
    main()
