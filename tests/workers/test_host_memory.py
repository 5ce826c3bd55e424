"""A CPU trainer's freed tensors go back to the system (workers/host_memory.py): after glibc
has raised its mmap threshold, blocks under it that a step frees stay resident in the heap
unless the threshold is fixed. Each case runs in a fresh interpreter (the setting is
process-wide)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.servers import ROOT

CODE = """
import os, sys
import torch
def rss():
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
if sys.argv[1] == "tuned":
    from workers.host_memory import cpu_allocator_tune
    assert cpu_allocator_tune()
big = torch.ones(4 * 2**20); del big  # 16 MB mapped, then freed: glibc raises its threshold to 16 MB
before = rss()
held, pins = [], []
for _ in range(20):  # 20 x 4 MB, each followed by a small block that stays (a step's layout)
    held.append(torch.ones(2**20))
    pins.append(torch.ones(1000))
del held
print(round(rss() - before))
"""


def _retained_mb(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", CODE, mode], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return int(out.stdout.split()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_freed_tensors_leave_the_process_once_the_allocator_is_tuned() -> None:
    assert _retained_mb("default") >= 40, "the untuned case should keep the freed blocks (else this test shows nothing)"
    assert _retained_mb("tuned") <= 4


def test_a_learner_leaves_the_allocator_alone_unless_the_worker_asks() -> None:
    """The fixed threshold maps every large tensor afresh: bench/vs_trl's update step took
    0.79-0.83 s with it against 0.48-0.53 s without, so only RFT_TRAINER_CPU_MMAP_THRESHOLD
    turns it on (workers/trainer/resident.py)."""
    code = ("import torch; from workers.algorithms import Learner, LearnerSpec; from workers import host_memory;"
            "from workers.models.tiny import causal_lm_build, tokenizer_build;"
            "tok = tokenizer_build(texts=['1 + 1 = 2'], vocab_size=300);"
            "Learner(spec=LearnerSpec(algorithm='sft'), model=causal_lm_build(tokenizer=tok, hidden_size=32, layers=1,"
            " heads=2), tokenizer=tok); print(host_memory._tuned)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-1] == "False"


TRIM_CODE = """
import os, sys
import torch
def rss():
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
from workers import host_memory
assert host_memory.cpu_allocator_tune()
held, pins = [], []
for _ in range(100):  # 100 x 0.5 MB (under the 1 MB threshold: from the heap), each pinned in place by a small block
    held.append(torch.ones(2**17))
    pins.append(torch.ones(1000))
before = rss()
del held
freed = rss()
if sys.argv[1] == "trim":
    host_memory.heap_trim()
print(round(before - rss()))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_a_trim_hands_freed_blocks_under_the_threshold_back() -> None:
    def returned(mode: str) -> int:
        out = subprocess.run([sys.executable, "-c", TRIM_CODE, mode], capture_output=True, text=True, cwd=ROOT,
                             timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        return int(out.stdout.split()[-1])

    assert returned("keep") <= 5, "freed heap blocks between pinned ones should stay resident untrimmed"
    assert returned("trim") >= 40


BACKWARD_TRIM_CODE = """
import sys, torch
from workers import host_memory
from workers.algorithms import Learner, LearnerSpec, Rollout, TrainBatch
from workers.models.tiny import causal_lm_build, tokenizer_build
if sys.argv[1] == "tuned":
    assert host_memory.cpu_allocator_tune()
trims = []
real = host_memory.heap_trim
host_memory.heap_trim = lambda: (trims.append(1), real())[1]
tok = tokenizer_build(texts=["1 + 1 = 2"], vocab_size=300)
torch.manual_seed(0)
learner = Learner(spec=LearnerSpec(algorithm="sft"), model=causal_lm_build(tokenizer=tok, hidden_size=32, layers=3,
                  heads=2), tokenizer=tok)
rows = [Rollout(id=i, group_id=f"g{i}", prompt_ids=[5, 6, 7], completion_ids=[8, 9, 10 + i], is_expert=True)
        for i in range(2)]
learner.step(TrainBatch(expert=rows))
print(len(trims), float(sum(p.double().sum() for p in learner.model.parameters())))
"""


def test_a_tuned_learner_trims_the_heap_after_each_blocks_backward_and_makes_the_same_update() -> None:
    def run(mode: str) -> tuple[int, float]:
        out = subprocess.run([sys.executable, "-c", BACKWARD_TRIM_CODE, mode], capture_output=True, text=True,
                             cwd=ROOT, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        trims, total = out.stdout.split()[-2:]
        return int(trims), float(total)

    plain, tuned = run("plain"), run("tuned")
    assert plain[0] == 0
    assert tuned[0] == 3, "one trim per decoder block's backward"
    assert tuned[1] == plain[1]
