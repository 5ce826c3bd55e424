"""A learner group's rank sets its glibc mmap threshold from what it holds
(workers.host_memory.rank_mmap_threshold): the worker's RFT_TRAINER_CPU_MMAP_THRESHOLD scaled
by its share of the batch and of each gradient, so the rank's part of a block one process maps
is mapped too and goes back to the system when freed (bench/sharding: the heap a rank kept at
the one process's threshold set its peak). Allocator cases run in a fresh interpreter (the
setting is process-wide)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.servers import ROOT
from workers.host_memory import RANK_MMAP_THRESHOLD_MIN, rank_mmap_threshold

MB = 1 << 20


def test_a_ranks_threshold_is_the_workers_scaled_by_its_share_within_bounds() -> None:
    assert rank_mmap_threshold(MB, world=1) == MB, "one process keeps the worker's"
    assert rank_mmap_threshold(MB, world=2) == MB // 2
    assert rank_mmap_threshold(MB, world=4) == MB // 4
    # Never under glibc's own starting threshold, however many ranks.
    assert rank_mmap_threshold(MB, world=64) == RANK_MMAP_THRESHOLD_MIN
    # Never above what the worker asked for, and off stays off.
    assert rank_mmap_threshold(64 << 10, world=2) == 64 << 10
    assert rank_mmap_threshold(0, world=2) == 0


CODE = """
import os, sys
import torch
from workers import host_memory
def rss():
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
for world in sys.argv[1:]:  # the learners this process holds, in the order they are built
    assert host_memory.cpu_allocator_tune(threshold=host_memory.rank_mmap_threshold(2**20, world=int(world)))
before = rss()
held, pins = [], []
for _ in range(24):  # 24 x 0.75 MB (a rank's half-batch hidden state), each pinned in place by a small block
    held.append(torch.ones(3 * 2**16))
    pins.append(torch.ones(1000))
del held
print(round(rss() - before))
"""


def _retained_mb(*worlds: int) -> int:
    out = subprocess.run([sys.executable, "-c", CODE, *map(str, worlds)], capture_output=True, text=True, cwd=ROOT,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return int(out.stdout.split()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_a_rank_returns_the_blocks_of_its_share_that_a_whole_process_threshold_keeps() -> None:
    assert _retained_mb(1) >= 12, "at the worker's 1 MB the freed 0.75 MB blocks stay in the heap (else this shows nothing)"
    assert _retained_mb(2) <= 2


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_a_worker_that_holds_a_rank_and_a_whole_learner_keeps_the_ranks_threshold() -> None:
    # A train worker that built a one-process run's learner, then a group's rank 0, then another one-process run's.
    assert _retained_mb(1, 2, 1) <= 2
