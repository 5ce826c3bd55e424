"""Peak trainer memory and step time of a ~100M-parameter Qwen2 (built locally, random
weights) under four settings, each a GRPO learner step (workers.algorithms.Learner) on the
same batch: full fine-tuning in fp32 (AdamW), + gradient checkpointing, LoRA, LoRA +
gradient checkpointing. Target: LoRA + checkpointing ≤ 0.35× the memory of full fp32.

Each setting runs in its own process (peak RSS is per process); memory is the peak RSS
above the process's RSS before the model was built, so it counts weights, gradients,
optimizer state and activations. Before that baseline each process builds and steps the
same learner on a 2-layer, 64-wide model: what TRL, transformers and accelerate set up
once per process (imports, caches, allocator arenas; ~0.6 GB of RSS here) is then in the
baseline of every setting instead of inflating the small ones' ratios. Ratios are to full
fp32 in the same run.

Short sequences and two steps by default, so that the four settings finish in minutes on a
two-core CPU host (a ~100M model at 8 × 256 tokens took tens of minutes per setting there);
the logits of a 16k vocabulary over long sequences would otherwise dominate every setting.
On a CUDA host (--device cuda) memory is the allocator's peak instead of RSS.

    python -m bench.trainer_memory [--layers 12] [--hidden 768] [--batch 4] [--prompt 32] [--completion 64] [--steps 2]
                                   [--settings "full fp32,LoRA + checkpointing"]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SETTINGS = {
    "full fp32": {"lora": False, "ckpt": False},
    "full + checkpointing": {"lora": False, "ckpt": True},
    "LoRA": {"lora": True, "ckpt": False},
    "LoRA + checkpointing": {"lora": True, "ckpt": True},
}


def _rss_mb() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def bench_tokenizer() -> Any:
    from workers.models.tiny import tokenizer_build

    return tokenizer_build(texts=[f"{a} + {b} = {a + b}" for a in range(30) for b in range(30)], vocab_size=300)


def qwen2_learner(args: argparse.Namespace, tokenizer: Any, *, layers: int, hidden: int, intermediate: int,
                  lora: bool = False, ckpt: bool = False) -> tuple[Any, int]:
    """(a GRPO learner on a Qwen2-shaped model of these sizes with random weights, its
    parameter count): the model every memory bench measures (bench/sharding too)."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    from kernel.config import AdapterConfig
    from workers.weights.adapters import adapter_wrap
    from workers.algorithms import Learner, LearnerSpec
    from workers.algorithms import trl_bridge as bridge

    adapter = AdapterConfig(rank=16, alpha=32.0, dropout=0.0,
                            target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    config = Qwen2Config(
        vocab_size=args.vocab, hidden_size=hidden, intermediate_size=intermediate,
        num_hidden_layers=layers, num_attention_heads=hidden // 64,
        num_key_value_heads=min(args.kv_heads, hidden // 64),
        max_position_embeddings=1024, tie_word_embeddings=False, pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).to(args.device)
    params = sum(p.numel() for p in model.parameters())
    if lora:
        model = adapter_wrap(model=model, lora=adapter)
    spec = LearnerSpec(algorithm="grpo", params=bridge.TrainParams(learning_rate=1e-5,
                                                                   max_completion_length=args.completion),
                       gradient_checkpointing=ckpt, lora=adapter if lora else None,
                       algorithm_params={"loss_type": "grpo"})
    return Learner(spec=spec, model=model, tokenizer=tokenizer), params


def bench_rollouts(args: argparse.Namespace) -> list[Any]:
    """`args.batch` rollouts in groups of four, random tokens of the set lengths."""
    import torch

    from workers.algorithms import Rollout

    g = torch.Generator().manual_seed(1)
    rollouts = []
    for i in range(args.batch):
        group = i // 4
        rollouts.append(Rollout(
            id=i, group_id=f"g{group}", prompt_ids=torch.randint(10, args.vocab, (args.prompt,), generator=g).tolist(),
            completion_ids=torch.randint(10, args.vocab, (args.completion,), generator=g).tolist(),
            logprobs=None, reward=float(i % 3),
        ))
    return rollouts


def _one(name: str, args: argparse.Namespace) -> dict[str, float]:
    import torch

    from workers.algorithms import TrainBatch

    torch.set_num_threads(max(1, args.threads))
    if args.mmap_threshold and args.device == "cpu":
        # What a train worker does with RFT_TRAINER_CPU_MMAP_THRESHOLD set (off by default:
        # it slows the step; see rftweb/settings.py).
        from workers.host_memory import cpu_allocator_tune

        cpu_allocator_tune(threshold=args.mmap_threshold)
    setting = SETTINGS[name]
    tokenizer = bench_tokenizer()
    cuda = args.device == "cuda"

    def build(layers: int, hidden: int, intermediate: int) -> tuple[Any, int]:
        return qwen2_learner(args, tokenizer, layers=layers, hidden=hidden, intermediate=intermediate,
                             lora=setting["lora"], ckpt=setting["ckpt"])

    rollouts = bench_rollouts(args)
    # The once-per-process setup, on a small model, before the baseline (see the docstring).
    warm, _ = build(2, 64, 128)
    warm.step(TrainBatch(usual=rollouts[:4]))
    del warm
    gc.collect()
    base_rss = _rss_mb()
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        base_cuda = torch.cuda.memory_allocated()
    learner, params = build(args.layers, args.hidden, args.intermediate)
    seconds = []
    for _ in range(args.steps):
        started = time.perf_counter()
        learner.step(TrainBatch(usual=rollouts))
        if cuda:
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - started)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if cuda:
        peak, base_rss = torch.cuda.max_memory_allocated() / 2**20, base_cuda / 2**20
    trainable = sum(p.numel() for p in learner.model.parameters() if p.requires_grad)
    return {"params": params, "trainable": trainable, "peak_mb": peak - base_rss,
            "step_seconds": min(seconds[1:] or seconds)}


def model_arguments(parser: argparse.ArgumentParser) -> None:
    """The model's shape and the GRPO batch, as qwen2_learner and bench_rollouts read them
    (bench/sharding builds the same model)."""
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--intermediate", type=int, default=2048)
    parser.add_argument("--kv-heads", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=16384)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--completion", type=int, default=64)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--steps", type=int, default=2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    model_arguments(parser)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--mmap-threshold", type=int, default=1 << 20,
                        help="glibc mmap threshold of each setting's process, as RFT_TRAINER_CPU_MMAP_THRESHOLD (0: glibc's default)")
    parser.add_argument("--parallel", type=int, default=1,
                        help="settings run at once (1: each alone, so its step time is its own; a smoke test's "
                             "tiny sizes take 2: peak memory is per process either way)")
    parser.add_argument("--settings", default=",".join(SETTINGS),
                        help="the settings to run, comma-separated (full fp32, which the ratios are to, always "
                             "runs; a smoke test runs it and LoRA + checkpointing: each setting is a process that "
                             "imports torch and TRL)")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print("RESULT " + json.dumps(_one(args.one, args)), flush=True)
        return
    chosen = {name.strip() for name in args.settings.split(",") if name.strip()} | {"full fp32"}
    if chosen - set(SETTINGS):
        parser.error(f"unknown setting(s) {sorted(chosen - set(SETTINGS))}: choose from {list(SETTINGS)}")
    names = [name for name in SETTINGS if name in chosen]

    path = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    env = {**os.environ, "PYTHONPATH": path, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}

    def setting(name: str) -> dict[str, float]:
        load = os.getloadavg()[0]
        out = subprocess.run([sys.executable, "-m", "bench.trainer_memory", "--one", name, *sys.argv[1:]],
                             capture_output=True, text=True, env=env, cwd=ROOT)
        line = next((l for l in out.stdout.splitlines() if l.startswith("RESULT ")), None)
        if line is None:
            sys.exit(f"{name} failed:\n{out.stderr[-3000:]}")
        print(f"  done: {name} (load average {load:.2f})", flush=True)
        return {**json.loads(line.removeprefix("RESULT ")), "load": load}

    with ThreadPoolExecutor(max_workers=max(1, args.parallel)) as pool:
        results = dict(zip(names, pool.map(setting, names), strict=True))

    base = results["full fp32"]
    print(f"\nmodel: {base['params'] / 1e6:.1f}M parameters (Qwen2, {args.layers} layers, hidden {args.hidden}); "
          f"batch {args.batch} × ({args.prompt} + {args.completion}) tokens; GRPO step; device {args.device}; "
          f"mmap threshold {args.mmap_threshold or 'glibc default'}")
    print(f"{'setting':<24}{'trainable':>12}{'peak MB':>10}{'× fp32':>8}{'step s':>9}{'× fp32':>8}{'load':>7}")
    for name, r in results.items():
        print(f"{name:<24}{r['trainable'] / 1e6:>11.2f}M{r['peak_mb']:>10.0f}{r['peak_mb'] / base['peak_mb']:>8.2f}"
              f"{r['step_seconds']:>9.2f}{r['step_seconds'] / base['step_seconds']:>8.2f}{r['load']:>7.2f}")
    if "LoRA + checkpointing" not in results:
        return
    ratio = results["LoRA + checkpointing"]["peak_mb"] / base["peak_mb"]
    print(f"\nLoRA + checkpointing memory: {ratio:.2f}× full fp32 (target ≤ 0.35×): {'met' if ratio <= 0.35 else 'NOT met'}; "
          f"load average now {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
