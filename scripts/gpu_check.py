"""The prepared GPU check: what a session runs the moment it is lent a GPU (`make gpu-check`).

On the lent machine's own PyTorch (its image holds torch, transformers, peft, accelerate,
pytest; the rest travels as wheels under .whl/, scripts/gpu_wheels.txt), in this order:

1. `tests/gpu` (the CUDA paths: bf16/fp16 steps, checkpointing memory, LoRA on a bf16 base,
   8-bit AdamW, NCCL sync and learner gangs where there are GPUs enough);
2. a GRPO step with a LoRA adapter on a bf16 base,
3. a full-weight GRPO step under FSDP2 (`learner_shard`, sharding `full`, bf16 compute with
   fp32 master weights) over NCCL on every GPU of the host,
   both on a randomly initialised Qwen2-shaped model of ~0.5B parameters built on the spot
   (Qwen2-0.5B's shape: hidden 896, 24 layers, 14 heads, 2 KV heads, vocabulary 151,936),
   each printing its peak GPU memory and tokens per second, and each beside stock TRL's
   `GRPOTrainer` on the same model, batch and loss (scripts/gpu_side_by_side.py);
4. rftweb's transformers engine's rollout throughput beside TRL's own generation;
5. rftweb's learner on a fixed batch (the loss must fall, the weights move) and the version it
   wrote loaded back through the meta-device path, every tensor equal;
6. the vLLM engine, where vLLM is importable (its CUDA wheel does not fit the 64 MiB carry
   limit, so on the lent machine it says so and moves on).

Last, one line per pair: rftweb/TRL tokens per second and peak memory (target: 1.0x or better).

It prints one line per figure and, where $OUT is set (the device machine), writes them to
$OUT/gpu-check.json. Sized to finish within 8 minutes on one H100.

`--cpu-dry-run` runs the same code on the CPU at a tiny size (fp32, gloo): what the suite
runs here (tests/test_gpu_check.py), so a session with a GPU only has to run the command.
"""

from __future__ import annotations

import argparse
import gc
import importlib.abc
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
# The dry run hides every installed distribution the GPU image lacks and no wheel brings, in
# this process and the ones it starts (the FSDP2 ranks, the tests/gpu run), so an import the
# lent machine could not satisfy fails here first.
IMAGE_ONLY = "RFT_GPU_CHECK_IMAGE_ONLY"
PROJECT = {"kernel", "apps", "workers", "rftweb", "bench", "tests", "scripts", "conftest", "manage"}

# Qwen2-0.5B's shape (config.json of Qwen/Qwen2-0.5B): 494M parameters with tied embeddings.
QWEN2_05B = {"hidden_size": 896, "intermediate_size": 4864, "layers": 24, "heads": 14, "kv_heads": 2,
             "vocab_size": 151_936}
TINY = {"hidden_size": 64, "intermediate_size": 128, "layers": 2, "heads": 4, "kv_heads": 2, "vocab_size": 512}
# A GRPO batch: groups x completions of prompt + completion tokens.
# 16,384 tokens a step: the full-weight step's activations (no checkpointing) and the logits over a
# 151,936-token vocabulary stay well inside an H100's 80 GB.
GPU_BATCH = {"groups": 8, "size": 8, "prompt": 128, "completion": 128}
CPU_BATCH = {"groups": 2, "size": 4, "prompt": 16, "completion": 8}
# What the vLLM CUDA wheel weighs against the device tool's carry limit.
CARRY_LIMIT_MB = 64
VLLM_WHEEL_NOTE = ("vLLM: not run: vllm is not installed on this machine and its CUDA wheel (over 300 MB) "
                   f"does not fit the device tool's {CARRY_LIMIT_MB} MiB carry limit")


# After the path set-up above: the script runs from anywhere.
from scripts import gpu_side_by_side as side  # noqa: E402
from scripts.gpu_kit import (  # noqa: E402
    Figure, batch_tokens, learner_build, model_build, peak_mb, rollouts, timed_steps, tokenizer_build,
)

# --- the checks --------------------------------------------------------------------------------

PYTEST_ARGS = ["--noconftest", "-p", "no:django", "-p", "no:cacheprovider", "-m", "gpu", "tests/gpu", "-q", "-rs"]


def gpu_tests(*, timeout: float) -> Figure:
    started = time.monotonic()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    if os.environ.get(IMAGE_ONLY) == "1":
        # Through this script, so pytest runs behind the same hiding; the image's plugins are
        # not the ones installed here, so none is loaded by entry point.
        argv = [sys.executable, str(Path(__file__).resolve()), "--pytest"]
        env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    else:
        argv = [sys.executable, "-m", "pytest", *PYTEST_ARGS]
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    tail = [line for line in done.stdout.splitlines() if line.strip()][-12:]
    print("\n".join(tail), flush=True)
    summary = tail[-1] if tail else done.stderr[-500:]
    return Figure("tests/gpu", done.returncode == 0, summary, {"seconds": time.monotonic() - started})


def lora_step(*, device: str, shape: dict[str, int], batch: dict[str, int], steps: int) -> Figure:
    import torch

    from kernel.config import AdapterConfig
    from workers.weights.adapters import adapter_wrap

    precision = "bf16" if device == "cuda" else "fp32"
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    model = model_build(shape=shape, dtype=dtype, device=device)
    params = sum(p.numel() for p in model.parameters())
    adapter = AdapterConfig(rank=16, alpha=32.0)
    learner = learner_build(model=adapter_wrap(model=model, lora=adapter), precision=precision, adapter=adapter,
                            completion=batch["completion"])
    seconds, loss = timed_steps(learner, rollouts(batch, vocab=shape["vocab_size"]), steps=steps, device=device)
    trained = sum(p.numel() for p in learner.model.parameters() if p.requires_grad)
    ok = bool(torch.isfinite(torch.tensor(loss))) and 0 < trained < params
    return Figure(f"GRPO step, LoRA on a {precision} base", ok, f"{params:,} parameters, {trained:,} trained",
                  {"peak MiB": peak_mb(device), "tokens/s": batch_tokens(batch) / seconds, "s/step": seconds})


def fsdp_rank(rank: int, world: int, addr: str, device: str, shape: dict[str, int], batch: dict[str, int], steps: int,
              out: str) -> None:
    """One rank of the full-weight FSDP2 step (spawned: NCCL wants a process per GPU)."""
    import torch
    import torch.distributed as dist

    from workers.algorithms.sharding import learner_shard

    if device == "cuda":
        torch.cuda.set_device(rank)
        torch.cuda.reset_peak_memory_stats()
    dist.init_process_group("cpu:gloo,cuda:nccl" if device == "cuda" else "gloo", init_method=addr,
                            world_size=world, rank=rank)
    try:
        precision = "bf16" if device == "cuda" else "fp32"
        # Full fine-tuning keeps fp32 master weights; FSDP2's MixedPrecisionPolicy computes in bf16.
        model = model_build(shape=shape, dtype=torch.float32, device=f"cuda:{rank}" if device == "cuda" else "cpu")
        params = sum(p.numel() for p in model.parameters())
        learner = learner_build(model=model, precision=precision, adapter=None, completion=batch["completion"])
        shard = learner_shard(learner, rank=rank, world=world, sharding="full")
        seconds, loss = timed_steps(learner, rollouts(batch, vocab=shape["vocab_size"]), steps=steps, device=device,
                                    shard=shard)
        if rank == 0:
            Path(out).write_text(json.dumps({"seconds": seconds, "loss": loss, "params": params,
                                             "peak": peak_mb(device)}))
    finally:
        dist.destroy_process_group()


def fsdp_step(*, device: str, shape: dict[str, int], batch: dict[str, int], steps: int) -> Figure:
    import torch
    import torch.multiprocessing as mp

    from bench.common import free_port

    world = max(1, torch.cuda.device_count()) if device == "cuda" else 1
    with tempfile.TemporaryDirectory(prefix="rft-gpu-check-") as tmp:
        out = str(Path(tmp) / "rank0.json")
        mp.start_processes(fsdp_rank, args=(world, f"tcp://127.0.0.1:{free_port()}", device, shape, batch, steps, out),
                           nprocs=world, start_method="spawn")
        got = json.loads(Path(out).read_text())
    ok = bool(torch.isfinite(torch.tensor(got["loss"])))
    precision = "bf16 compute, fp32 weights" if device == "cuda" else "fp32"
    return Figure(f"GRPO step, full weights under FSDP2 ({precision}), {world} rank(s)", ok,
                  f"{got['params']:,} parameters",
                  {"rank 0 peak MiB": got["peak"], "tokens/s": world * batch_tokens(batch) / got["seconds"],
                   "s/step": got["seconds"]})


def vllm_engine(*, device: str, shape: dict[str, int]) -> Figure:
    import importlib.util

    if device != "cuda":
        return Figure("vLLM engine", True, "not run on the CPU dry run (the suite's vllm tests cover vLLM's CPU build)")
    if importlib.util.find_spec("vllm") is None:
        return Figure("vLLM engine", True, VLLM_WHEEL_NOTE)
    from vllm import LLM, SamplingParams

    with tempfile.TemporaryDirectory(prefix="rft-gpu-vllm-") as tmp:
        import torch

        model = model_build(shape=shape, dtype=torch.bfloat16, device="cpu")
        model.save_pretrained(tmp)
        tokenizer_build().save_pretrained(tmp)
        del model
        llm = LLM(model=tmp, dtype="bfloat16", max_model_len=1024, gpu_memory_utilization=0.5, enforce_eager=True, seed=0)
        prompts = [{"prompt_token_ids": list(range(10, 138))} for _ in range(64)]
        started = time.perf_counter()
        outputs = llm.generate(prompts, SamplingParams(max_tokens=128, ignore_eos=True, temperature=1.0))
        seconds = time.perf_counter() - started
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    return Figure("vLLM engine", tokens > 0, "", {"generated tokens/s": tokens / seconds})


# --- what must travel --------------------------------------------------------------------------

def wheel_list() -> list[str]:
    """The requirements scripts/gpu_wheels.txt names (the wheels carried to the GPU machine)."""
    lines = (ROOT / "scripts" / "gpu_wheels.txt").read_text().splitlines()
    return [line.split("#")[0].strip() for line in lines if line.split("#")[0].strip()]


def image_packages() -> set[str]:
    """The distributions the GPU machine's image holds (scripts/gpu_image_packages.txt)."""
    text = (ROOT / "scripts" / "gpu_image_packages.txt").read_text()
    return {normalise(name) for line in text.splitlines() for name in line.split("#")[0].split(",") if name.strip()}


def normalise(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(".", "-")


def image_closure(names: set[str]) -> set[str]:
    """The image's distributions and, as installed here, everything they require: the image's
    own versions bring what they need there (huggingface-hub here may need a package the
    image's older one does not), so only what the project itself imports is judged."""
    import importlib.metadata as md
    import re as regex

    seen: set[str] = set()
    todo = list(names)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = md.requires(name) or []
        except md.PackageNotFoundError:
            continue
        for requirement in requires:
            if "extra ==" in requirement:
                continue
            match = regex.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement)
            if match:
                todo.append(normalise(match.group(0)))
    return seen


def hidden_distributions() -> tuple[set[str], set[str]]:
    """(distributions, top-level modules) installed here that the lent machine would not have."""
    import importlib.metadata as md

    allowed = image_closure(image_packages()) | {normalise(req.split("==")[0]) for req in wheel_list()}
    dists: set[str] = set()
    modules: set[str] = set()
    for module, owners in md.packages_distributions().items():
        if module in PROJECT or module in sys.stdlib_module_names:
            continue
        missing = {normalise(d) for d in owners} - allowed
        if missing and not ({normalise(d) for d in owners} & allowed):
            dists |= missing
            modules.add(module)
    return dists, modules


class ImageOnly(importlib.abc.MetaPathFinder):
    """A meta-path finder that makes the hidden modules absent: an import raises
    ModuleNotFoundError naming the module, as on the lent machine."""

    def __init__(self, modules: set[str]) -> None:
        self.modules = modules

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        top = name.split(".")[0]
        if top in self.modules:
            raise ModuleNotFoundError(f"No module named {top!r} (the GPU image lacks it and no carried wheel brings it)",
                                      name=top)
        return None


def image_only_install() -> int:
    """Hide what the lent machine lacks from imports, availability probes (find_spec) and
    installed-package listings (importlib.metadata); returns how many distributions."""
    import importlib.metadata as md
    import importlib.util

    dists, modules = hidden_distributions()
    sys.meta_path.insert(0, ImageOnly(modules))
    real_find_spec = importlib.util.find_spec
    real_version, real_distribution, real_distributions = md.version, md.distribution, md.distributions

    def find_spec(name: str, package: str | None = None) -> Any:
        return None if name.split(".")[0] in modules else real_find_spec(name, package)

    def version(name: str) -> str:
        if normalise(name) in dists:
            raise md.PackageNotFoundError(name)
        return real_version(name)

    def distribution(name: str) -> Any:
        if normalise(name) in dists:
            raise md.PackageNotFoundError(name)
        return real_distribution(name)

    def distributions(**kwargs: Any) -> Any:
        return (d for d in real_distributions(**kwargs) if normalise(d.metadata["Name"] or "") not in dists)

    importlib.util.find_spec = find_spec
    md.version, md.distribution, md.distributions = version, distribution, distributions  # type: ignore[assignment]
    return len(dists)


if os.environ.get(IMAGE_ONLY) == "1":
    HIDDEN = image_only_install()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="The prepared GPU check (make gpu-check): tests/gpu, a LoRA bf16 GRPO "
                                                 "step and a full-weight FSDP2 step on a ~0.5B Qwen2, the vLLM engine.")
    parser.add_argument("--cpu-dry-run", action="store_true",
                        help="the same code on the CPU at a tiny size (fp32, gloo), as the suite runs it")
    parser.add_argument("--skip-tests", action="store_true", help="leave out tests/gpu")
    parser.add_argument("--steps", type=int, default=3, help="timed steps after one warm-up step (default 3)")
    parser.add_argument("--tests-timeout", type=float, default=240.0, help="seconds tests/gpu may take (default 240)")
    parser.add_argument("--batch", help="GROUPS,SIZE,PROMPT,COMPLETION of the GRPO batch (default 8,8,128,128 on a GPU, "
                                        "2,4,16,8 on the dry run)")
    parser.add_argument("--pytest", action="store_true", help=argparse.SUPPRESS)  # the tests/gpu run, behind the hiding
    args = parser.parse_args(argv)
    if args.pytest:
        import pytest

        return int(pytest.main(PYTEST_ARGS))
    if args.cpu_dry_run and os.environ.get(IMAGE_ONLY) != "1":
        # Again, hidden from the start: what this process imported so far would stay importable.
        os.environ[IMAGE_ONLY] = "1"
        return subprocess.call([sys.executable, str(Path(__file__).resolve()), *(argv if argv is not None else sys.argv[1:])])
    if args.steps < 1:
        parser.error("--steps must be at least 1")
    batch_values: list[int] = []
    if args.batch:
        try:
            batch_values = [int(v) for v in args.batch.split(",")]
        except ValueError:
            batch_values = []
        if len(batch_values) != 4 or min(batch_values) < 1:
            parser.error("--batch takes four positive integers: GROUPS,SIZE,PROMPT,COMPLETION")

    import torch

    device = "cpu" if args.cpu_dry_run else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        parser.error("no CUDA device: run on the lent GPU machine, or with --cpu-dry-run here")
    shape, batch = (TINY, CPU_BATCH) if args.cpu_dry_run else (QWEN2_05B, GPU_BATCH)
    if args.batch:
        batch = dict(zip(("groups", "size", "prompt", "completion"), batch_values, strict=True))
    where = torch.cuda.get_device_name(0) if device == "cuda" else "CPU (dry run)"
    print(f"gpu-check on {where}: python {sys.version.split()[0]}, torch {torch.__version__}", flush=True)

    figures: list[Figure] = []
    checks: list[tuple[str, Callable[[], Figure]]] = [("tests/gpu", lambda: gpu_tests(timeout=args.tests_timeout))] if not args.skip_tests else []
    checks += [
        ("LoRA step", lambda: lora_step(device=device, shape=shape, batch=batch, steps=args.steps)),
        # rftweb's spawned FSDP2 ranks before any stock TRL trainer: accelerate's state in this
        # process (a process group of its own) must not be what the ranks start beside.
        ("FSDP2 step", lambda: fsdp_step(device=device, shape=shape, batch=batch, steps=args.steps)),
        ("stock TRL LoRA step", lambda: side.trl_step(device=device, shape=shape, batch=batch, steps=args.steps,
                                                      lora=True)),
        ("stock TRL full-weight step", lambda: side.trl_step(device=device, shape=shape, batch=batch,
                                                             steps=args.steps, lora=False)),
        ("rollout throughput", lambda: side.generation(device=device, shape=shape, batch=batch)),
        ("learns, version round trip", lambda: side.learns(device=device, shape=shape, batch=batch)),
        ("vLLM", lambda: vllm_engine(device=device, shape=shape)),
    ]
    for name, check in checks:
        try:
            figure = check()
        except Exception as exc:  # noqa: BLE001 - one check's failure must not hide the others' figures
            figure = Figure(name, False, f"{type(exc).__name__}: {exc}"[:800])
        print(figure.line(), flush=True)
        figures.append(figure)
        if device == "cuda":
            gc.collect()  # a check's trainer and model go before the next one's peak is read
            torch.cuda.empty_cache()

    for line in side.ratios(figures):
        print(line, flush=True)
    if os.environ.get(IMAGE_ONLY) == "1":
        print(f"(dry run: {HIDDEN} installed distributions the GPU image lacks were hidden from every import)", flush=True)
    out = os.environ.get("OUT")
    if out:
        Path(out, "gpu-check.json").write_text(json.dumps([asdict(f) for f in figures], indent=1))
    failed = [f.name for f in figures if not f.ok]
    print(f"gpu-check: {len(figures) - len(failed)} of {len(figures)} ok" + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
