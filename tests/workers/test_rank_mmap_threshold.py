"""A learner gang's rank sets its glibc mmap threshold from what it holds
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
import ctypes, os, sys
import torch
from workers import host_memory
class MallInfo2(ctypes.Structure):  # glibc >= 2.33
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2
def mapped():  # MB of live blocks glibc serves with their own mapping (handed back on free)
    return libc.mallinfo2().hblkhd / 2**20
def rss():
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
# One thread, and every op of the pattern run once before the first reading: torch's first
# fill starts its thread pool and loads kernels (a few MB of stacks and arenas on a many-core
# host, which a reading after it would count as kept).
torch.set_num_threads(1)
for world in sys.argv[1:]:  # the learners this process holds, in the order they are built
    assert host_memory.cpu_allocator_tune(threshold=host_memory.rank_mmap_threshold(2**20, world=int(world)))
held, pins = [torch.ones(3 * 2**16)], [torch.ones(1000)]
del held
before_rss, before_mapped = rss(), mapped()
held = []
for _ in range(24):  # 24 x 0.75 MB (a rank's half-batch hidden state), each pinned in place by a small block
    held.append(torch.ones(3 * 2**16))
    pins.append(torch.ones(1000))
held_mapped = mapped() - before_mapped
del held
print(round(held_mapped), round(rss() - before_rss))
"""


def _mapped_and_retained_mb(*worlds: int) -> tuple[int, int]:
    """MB of the 18 MB held that glibc mapped, and MB of resident memory left after the free."""
    out = subprocess.run([sys.executable, "-c", CODE, *map(str, worlds)], capture_output=True, text=True, cwd=ROOT,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    held_mapped, retained = out.stdout.split()[-2:]
    return int(held_mapped), int(retained)


# Whether a freed heap block stays resident depends on where glibc put it (a free beside the
# heap's top is trimmed: 2-18 MB kept at 1 MB on the same machine), so the whole-process case
# asserts where the blocks came from; a mapped block is unmapped on free, every time.
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt and mallinfo2")
def test_a_rank_returns_the_blocks_of_its_share_that_a_whole_process_threshold_keeps() -> None:
    assert _mapped_and_retained_mb(1)[0] == 0, "at the worker's 1 MB the 0.75 MB blocks come from the heap"
    held_mapped, retained = _mapped_and_retained_mb(2)
    assert held_mapped >= 17, "a rank of two maps each 0.75 MB block of its share"
    assert retained <= 2


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt and mallinfo2")
def test_a_worker_that_holds_a_rank_and_a_whole_learner_keeps_the_ranks_threshold() -> None:
    # A train worker that built a one-process run's learner, then a gang's rank 0, then another one-process run's.
    held_mapped, retained = _mapped_and_retained_mb(1, 2, 1)
    assert held_mapped >= 17
    assert retained <= 2
