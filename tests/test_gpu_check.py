"""The prepared GPU check's CPU half (scripts/gpu_check.py, `make gpu-check`): the session that
is lent a GPU only runs it, so everything but CUDA is proven here. The dry run hides every
installed distribution the GPU image lacks and no carried wheel brings (a tests/gpu module
that imported psycopg through tests.servers failed it: `tests/gpu: 1 error`)."""

from __future__ import annotations

import importlib.metadata as md
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "gpu_check.py"


def _wheels() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "scripts" / "gpu_wheels.txt").read_text().splitlines():
        requirement = line.split("#")[0].strip()
        if requirement:
            name, _, version = requirement.partition("==")
            pins[name] = version
    return pins


def test_the_carried_wheels_are_pinned_to_what_the_venv_runs() -> None:
    """bitsandbytes is CUDA-only and not in .venv; every other wheel is the version tested here."""
    pins = _wheels()
    assert {"trl", "pydantic", "pydantic-core", "datasets"} <= set(pins)
    for name, version in pins.items():
        if name == "bitsandbytes":
            continue
        assert md.version(name) == version, f"scripts/gpu_wheels.txt pins {name}=={version}, .venv has {md.version(name)}"


def test_the_carried_wheels_sizes_fit_the_device_carry_limit_with_the_tree() -> None:
    sizes = [float(m) for m in re.findall(r"#\s*([\d.]+) MiB", (ROOT / "scripts" / "gpu_wheels.txt").read_text())]
    assert len(sizes) == len(_wheels())
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout.split(b"\0")
    tree_mib = sum((ROOT / name.decode()).stat().st_size for name in tracked if name and (ROOT / name.decode()).is_file()) / 2**20
    assert sum(sizes) + tree_mib < 60, f"wheels {sum(sizes):.1f} MiB + tree {tree_mib:.1f} MiB: over the 64 MiB carry limit's margin"


@pytest.mark.slow
def test_the_cpu_dry_run_runs_every_check_behind_the_gpu_images_imports() -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--cpu-dry-run", "--steps", "1"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("[")]
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert re.search(r"^\[ok\] tests/gpu: .*11 skipped", done.stdout, re.MULTILINE), lines
    for check in ("GRPO step, LoRA on a fp32 base", "GRPO step, full weights under FSDP2 (fp32), 1 rank(s)"):
        line = next(line for line in lines if check in line)
        assert line.startswith("[ok]"), line
        tokens = float(re.search(r"tokens/s ([\d,.]+)", line).group(1).replace(",", ""))  # type: ignore[union-attr]
        peak = float(re.search(r"peak MiB ([\d,.]+)", line).group(1).replace(",", ""))  # type: ignore[union-attr]
        assert tokens > 0 and peak > 0, line
    assert "LoRA" in lines[1] and re.search(r"[\d,]+ parameters, [\d,]+ trained", lines[1])
    assert re.search(r"\(dry run: \d+ installed distributions the GPU image lacks were hidden", done.stdout)
    for check in ("stock TRL GRPOTrainer step, LoRA on a fp32 base", "stock TRL GRPOTrainer step, full weights (fp32)"):
        line = next(line for line in lines if check in line)
        assert line.startswith("[ok]") and re.search(r"tokens/s [\d,.]+, .*— 2 steps ran", line), line
    rollout = next(line for line in lines if line.startswith("[ok] rollout: rftweb's transformers engine"))
    assert re.search(r"rftweb tokens/s [\d,.]+, TRL tokens/s [\d,.]+, ratio [\d.]+", rollout), rollout
    learns = next(line for line in lines if "learns on a fixed batch" in line)
    losses = [float(x) for x in re.findall(r"(-?[\d.]+)(?: ->| at lr)", learns)]
    assert learns.startswith("[ok]") and losses[-1] < losses[0] and " 0 differ after the round trip" in learns, learns
    for pair in ("LoRA", "full weights"):
        assert re.search(rf"^rftweb/TRL {pair}: tokens/s [\d.]+x .*peak memory [\d.]+x", done.stdout, re.MULTILINE), pair
    assert "gpu-check: 8 of 8 ok" in done.stdout


def test_without_a_gpu_the_check_says_so_and_exits_non_zero() -> None:
    done = subprocess.run([sys.executable, str(SCRIPT)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    assert "no CUDA device: run on the lent GPU machine, or with --cpu-dry-run here" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_bad_batch_is_refused_naming_the_option() -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--cpu-dry-run", "--batch", "8,8"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "--batch takes four positive integers" in done.stderr
