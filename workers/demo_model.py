"""The local demo model: a small Qwen2 warmed up on integer arithmetic with `<answer>` tags.

Built by `manage.py rft_demo_model`. The warm-up is a short supervised fine-tune on chat
formatted problems ("What is 12 + 34?" -> "<answer>46</answer>") that stops while the model
is still wrong often, so reinforcement fine-tuning on the demo taskset has something to
learn. Same seed and settings, same files: problems come from a seeded generator, the
weights from a seeded init, and training runs on one thread in a fixed order.

Same files on another machine too, as far as the CPU allows: the build runs in a fresh
Python process (`python -m workers.demo_model`) whose numerics are pinned before torch
loads (`NUMERICS_ENV`: one thread, torch's AVX2 kernels and MKL's AVX2 code path even on
AVX-512 CPUs, which otherwise sum in another order and give other bits), so neither the
caller's thread settings nor its CPU's widest vector unit change the weights. Different
torch / transformers / tokenizers versions may (weight init and kernels move between
releases): the manifest records them and a build with other versions is not "current".

A manifest (`rft-demo.json`) records the settings; a build into a directory that already
holds a model made with the same settings and library versions is skipped.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

MANIFEST = "rft-demo.json"
TASKSET_FILE = "demo-taskset.jsonl"
# Bump when the recipe changes in a way that changes the files, so old caches rebuild.
# 3: `<|endoftext|>` in the tokenizer's vocabulary (the reloaded tokenizer's length is the
# model's vocab size); the build in a child process with pinned numerics; the chat template
# renders tools Hermes-style and ends assistant turns with eos.
# 4: both of 3's changes at once (they were made on two branches, each calling itself 3).
RECIPE = 4

# Set before torch loads in the build's process. MKL_CBWR: MKL's conditional numerical
# reproducibility (the same code path on every AVX2 CPU); ATEN_CPU_CAPABILITY and
# ONEDNN_MAX_CPU_ISA: torch's own and oneDNN's kernels no wider than AVX2. A CPU without
# AVX2 falls back to its default path (and may then give other bits).
NUMERICS_ENV = {
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "MKL_CBWR": "AVX2",
    "ATEN_CPU_CAPABILITY": "avx2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "PYTHONHASHSEED": "0",
    "TOKENIZERS_PARALLELISM": "false",
    "CUDA_VISIBLE_DEVICES": "",
}
VERSIONED = ("torch", "transformers", "tokenizers")

OPS = ("+", "-")


@dataclass(frozen=True)
class DemoSettings:
    seed: int = 0
    # Warm-up stops at the first check where held-out accuracy reaches target_accuracy, or
    # after `steps`: deterministic either way, since the checks draw no random numbers.
    steps: int = 600
    target_accuracy: float = 0.2
    eval_every: int = 25
    batch_size: int = 64
    learning_rate: float = 1e-3
    hidden_size: int = 128
    layers: int = 4
    heads: int = 4
    vocab_size: int = 384
    max_operand: int = 99
    # The second operand stays small: learnable in minutes, still often wrong when carrying.
    max_second: int = 9
    heldout: int = 200
    taskset_size: int = 256
    recipe: int = RECIPE


@dataclass
class DemoResult:
    out: Path
    settings: DemoSettings
    accuracy: float
    built: bool
    seconds: float = 0.0
    files: dict[str, str] = field(default_factory=dict)


def problem_text(a: int, op: str, b: int) -> str:
    return f"What is {a} {op} {b}?"


def answer_of(a: int, op: str, b: int) -> int:
    return a + b if op == "+" else a - b


def completion_text(value: int) -> str:
    return f"<answer>{value}</answer>"


def _problems(settings: DemoSettings) -> tuple[list[tuple[int, str, int]], list[tuple[int, str, int]], list[tuple[int, str, int]]]:
    """All problems split deterministically into train / held-out eval / demo taskset."""
    space = [(a, op, b) for op in OPS for a in range(settings.max_operand + 1) for b in range(settings.max_second + 1)]
    rng = random.Random(settings.seed)
    rng.shuffle(space)
    heldout = space[: settings.heldout]
    taskset = space[settings.heldout : settings.heldout + settings.taskset_size]
    train = space[settings.heldout + settings.taskset_size :]
    return train, heldout, taskset


def _tokenizer_corpus(settings: DemoSettings) -> list[str]:
    # Digits, operators and tags: what the demo talks about. Deterministic order.
    texts = [problem_text(a, op, b) + " " + completion_text(answer_of(a, op, b)) for a in range(0, 100, 7) for op in OPS for b in range(0, 100, 3)]
    texts += ["What is the answer? Think, then give <answer>N</answer>.", "Please answer with <answer></answer> tags."]
    return texts


def _encode(tokenizer: Any, problem: tuple[int, str, int]) -> tuple[list[int], list[int]]:
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": problem_text(*problem)}], add_generation_prompt=True, tokenize=False
    )
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    answer_ids = tokenizer(completion_text(answer_of(*problem)), add_special_tokens=False)["input_ids"]
    return prompt_ids, answer_ids + [tokenizer.eos_token_id]


def _as_loaded(tokenizer: Any, model: Any) -> Any:
    """The tokenizer as everyone else will load it: AutoTokenizer with the model's config.

    For a Qwen2 config, AutoTokenizer gives Qwen2's tokenizer class, whose pre-tokenizer (one
    token per digit) differs from the freshly trained one's; training on the freshly trained
    encoding would teach the model inputs that vLLM, TRL and the engines never send it.
    """
    import tempfile

    from transformers import AutoTokenizer

    with tempfile.TemporaryDirectory() as tmp:
        model.config.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        loaded = AutoTokenizer.from_pretrained(tmp)
    loaded.padding_side = "left"
    return loaded


def greedy_accuracy(*, model: Any, tokenizer: Any, problems: list[tuple[int, str, int]], batch_size: int = 100) -> float:
    """Share of problems whose greedy completion's tagged answer is right."""
    import re

    import torch

    correct = 0
    model.eval()
    for start in range(0, len(problems), batch_size):
        chunk = problems[start : start + batch_size]
        prompts = [_encode(tokenizer, p)[0] for p in chunk]
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=12, do_sample=False)
        for problem, row in zip(chunk, out[:, width:].tolist()):
            text = tokenizer.decode(row, skip_special_tokens=True)
            found = re.search(r"<answer>(-?\d+)</answer>", text)
            correct += bool(found and int(found.group(1)) == answer_of(*problem))
    return correct / max(1, len(problems))


def expected_accuracy(*, model: Any, tokenizer: Any, problems: list[tuple[int, str, int]], batch_size: int = 100) -> float:
    """Mean probability that the model samples the right completion (`<answer>N</answer>` and
    eos) at temperature 1: the expected accuracy GRPO maximises, read off one teacher-forced
    forward pass. Unlike greedy accuracy it moves with every change of the answer's
    probability, not only when the likeliest answer flips, so a small held-out set measures
    it with far less noise (and an unchanged model scores exactly the same)."""
    import torch

    total = 0.0
    model.eval()
    for start in range(0, len(problems), batch_size):
        rows = [_encode(tokenizer, p) for p in problems[start : start + batch_size]]
        width = max(len(p) + len(c) for p, c in rows)
        ids = torch.full((len(rows), width), tokenizer.pad_token_id)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, (p, c) in enumerate(rows):
            ids[i, : len(p) + len(c)] = torch.tensor(p + c)
            mask[i, : len(p) + len(c)] = 1
        with torch.no_grad():
            logps = torch.log_softmax(model(input_ids=ids, attention_mask=mask).logits.float(), dim=-1)
        for i, (p, c) in enumerate(rows):
            # The logits at position t predict token t + 1.
            picked = logps[i, len(p) - 1 : len(p) + len(c) - 1].gather(-1, torch.tensor(c).unsqueeze(-1))
            total += float(picked.sum().exp())
    return total / max(1, len(problems))


def _batches(train: list[tuple[int, str, int]], settings: DemoSettings) -> Iterator[list[tuple[int, str, int]]]:
    rng = random.Random(settings.seed + 1)
    order: list[tuple[int, str, int]] = []
    while True:
        if len(order) < settings.batch_size:
            more = list(train)
            rng.shuffle(more)
            order += more
        yield order[: settings.batch_size]
        del order[: settings.batch_size]


def manifest_read(out: Path, *, name: str = MANIFEST) -> dict[str, Any] | None:
    try:
        return json.loads((out / name).read_text())
    except (OSError, ValueError):
        return None


def file_hashes(out: Path, *, manifest: str = MANIFEST) -> dict[str, str]:
    """sha256 of every file a build wrote in `out`, its manifest aside."""
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(out.iterdir())
        if p.is_file() and p.name != manifest
    }


def library_versions(names: Sequence[str] = VERSIONED) -> dict[str, str]:
    """The installed versions of the libraries the files depend on (read without importing them)."""
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in names:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "absent"
    return out


def manifest_current(out: Path, *, manifest: str, settings: dict[str, Any], versions: Sequence[str]) -> dict[str, Any] | None:
    """The manifest when `out` holds an intact build with exactly these settings and the
    installed versions of `versions` (the demo model's and the tiny VLM's cache check)."""
    recorded_manifest = manifest_read(out, name=manifest)
    if not recorded_manifest or recorded_manifest.get("settings") != settings:
        return None
    if recorded_manifest.get("versions") != library_versions(versions):
        return None
    recorded = recorded_manifest.get("files") or {}
    if not recorded or any(not (out / name).is_file() for name in recorded):
        return None
    return recorded_manifest


def demo_model_current(out: Path, settings: DemoSettings) -> dict[str, Any] | None:
    """The manifest when `out` holds an intact model built with exactly these settings and
    the installed library versions."""
    return manifest_current(out, manifest=MANIFEST, settings=asdict(settings), versions=VERSIONED)


class DemoBuildFailed(RuntimeError):
    """The build's process exited with an error; the message holds the end of its output."""


def demo_model_build(
    *,
    out: str | Path,
    settings: DemoSettings | None = None,
    force: bool = False,
    progress: bool = True,
    log: Callable[[str], None] = print,
) -> DemoResult:
    """Build (or find already built) the demo model and its taskset in `out`.

    The build itself runs in a child process with `NUMERICS_ENV` (see the module docstring);
    its log lines come back through `log`, its progress bar on stderr.
    """
    settings = settings or DemoSettings()
    out = Path(out)
    if not force:
        manifest = demo_model_current(out, settings)
        if manifest is not None:
            return DemoResult(out=out, settings=settings, accuracy=manifest["accuracy"], built=False, files=manifest["files"])
    started = time.monotonic()
    root = Path(__file__).resolve().parent.parent
    cmd = [sys.executable, "-m", "workers.demo_model", "--out", str(out.resolve()),
           "--settings", json.dumps(asdict(settings))] + ([] if progress else ["--quiet"])
    # The child inherits this environment (not a setting: what the process was started with),
    # with the numerics pinned and this checkout first on its path.
    env = {**os.environ, **NUMERICS_ENV}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
    proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.PIPE, stderr=None if progress else subprocess.STDOUT,
                            text=True)
    tail: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        line = line.rstrip("\n")
        tail = (tail + [line])[-20:]
        if line.startswith("demo model:"):
            log(line)
    if proc.wait() != 0:
        raise DemoBuildFailed(f"building the demo model failed (exit {proc.returncode}):\n" + "\n".join(tail))
    manifest = manifest_read(out)
    if manifest is None:
        raise DemoBuildFailed(f"the demo model build wrote no manifest in {out}")
    return DemoResult(out=out, settings=settings, accuracy=manifest["accuracy"], built=True,
                      seconds=time.monotonic() - started, files=manifest["files"])


def _build_here(*, out: Path, settings: DemoSettings, progress: bool, log: Callable[[str], None] = print) -> DemoResult:
    """The build proper, in this process (`demo_model_build` runs it in a pinned child)."""
    import torch
    from tqdm import tqdm

    from workers.modelkit import causal_lm_build, tokenizer_build

    started = time.monotonic()
    # One thread: summation order, hence the weights' bits, do not depend on the machine's cores.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train, heldout, taskset = _problems(settings)
        built = tokenizer_build(texts=_tokenizer_corpus(settings), vocab_size=settings.vocab_size)
        model = causal_lm_build(
            tokenizer=built,
            hidden_size=settings.hidden_size,
            layers=settings.layers,
            heads=settings.heads,
            max_positions=256,
            seed=settings.seed,
        )
        tokenizer = _as_loaded(built, model)
        if len(tokenizer) != model.config.vocab_size:
            raise RuntimeError(f"the reloaded tokenizer has {len(tokenizer)} tokens, the model {model.config.vocab_size}")
        params = sum(p.numel() for p in model.parameters())
        log(f"demo model: {params / 1e6:.2f}M parameters, {len(train)} training problems, {settings.steps} steps")
        torch.manual_seed(settings.seed)
        optim = torch.optim.AdamW(model.parameters(), lr=settings.learning_rate, weight_decay=0.0)
        sched = torch.optim.lr_scheduler.LambdaLR(
            optim, lambda s: min(1.0, (s + 1) / 50) * max(0.05, 1 - s / settings.steps)
        )
        encoded: dict[tuple[int, str, int], tuple[list[int], list[int]]] = {}
        model.train()
        bar = tqdm(total=settings.steps, desc="warm-up SFT", disable=not progress, mininterval=1.0)
        batches = _batches(train, settings)
        accuracy: float | None = None
        for step in range(settings.steps):
            rows = [encoded.setdefault(p, _encode(tokenizer, p)) for p in next(batches)]
            width = max(len(p) + len(c) for p, c in rows)
            ids = torch.full((len(rows), width), tokenizer.pad_token_id)
            labels = torch.full((len(rows), width), -100)
            mask = torch.zeros((len(rows), width), dtype=torch.long)
            for i, (p, c) in enumerate(rows):
                seq = p + c
                ids[i, : len(seq)] = torch.tensor(seq)
                mask[i, : len(seq)] = 1
                # Loss on the answer only: the prompt is given, not learned.
                labels[i, len(p) : len(seq)] = torch.tensor(c)
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optim.step()
            sched.step()
            optim.zero_grad(set_to_none=True)
            bar.update(1)
            if step % 50 == 0 or step == settings.steps - 1:
                bar.set_postfix(loss=f"{loss.item():.3f}")
            if settings.eval_every and (step + 1) % settings.eval_every == 0 and step + 1 < settings.steps:
                accuracy = greedy_accuracy(model=model, tokenizer=tokenizer, problems=heldout)
                if progress:
                    bar.write(f"step {step + 1}: held-out accuracy {accuracy:.1%}")
                if accuracy >= settings.target_accuracy:
                    break
                accuracy = None
                model.train()
        bar.close()
        trained_steps = step + 1
        if accuracy is None:
            accuracy = greedy_accuracy(model=model, tokenizer=tokenizer, problems=heldout)
        log(f"demo model: after {trained_steps} steps, greedy accuracy on {len(heldout)} held-out problems: {accuracy:.1%}")

        out.mkdir(parents=True, exist_ok=True)
        (out / MANIFEST).unlink(missing_ok=True)
        model.save_pretrained(out, safe_serialization=True)
        tokenizer.save_pretrained(out)
        with (out / TASKSET_FILE).open("w") as fh:
            for a, op, b in taskset:
                record = {"prompt": problem_text(a, op, b), "answer": str(answer_of(a, op, b)), "domain": "math"}
                fh.write(json.dumps(record, sort_keys=True) + "\n")
        files = file_hashes(out)
        manifest = {
            "settings": asdict(settings), "accuracy": accuracy, "parameters": params, "steps": trained_steps, "files": files,
            "versions": library_versions(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        }
        (out / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    finally:
        torch.set_num_threads(threads)
    return DemoResult(
        out=out, settings=settings, accuracy=accuracy, built=True, seconds=time.monotonic() - started, files=files
    )


def _main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(description="Build the demo model here (demo_model_build runs this in a pinned child).")
    parser.add_argument("--out", required=True)
    parser.add_argument("--settings", required=True, help="DemoSettings as JSON")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    settings = DemoSettings(**json.loads(args.settings))
    _build_here(out=Path(args.out), settings=settings, progress=not args.quiet, log=lambda line: print(line, flush=True))


if __name__ == "__main__":
    _main()
