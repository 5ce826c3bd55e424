"""Host memory of a trainer on the CPU: large tensors go back to the system when freed.

PyTorch's CPU allocator is glibc's malloc. glibc serves a block at or above its mmap
threshold with its own mapping (returned on free), and below it from a heap (kept). The
threshold is dynamic: freeing a mapped block raises it to that block's size (up to 32 MB),
so after the first step every activation, logits tile and gradient under 32 MB comes from
the heap, and a step's transient tensors stay resident as fragments the next step only
partly reuses. On a ~100M-parameter Qwen2 step that kept 150-250 MB resident above the live
tensors, and set the peak (bench/trainer_memory). A fixed threshold turns the adjustment
off: blocks of `MMAP_THRESHOLD` and more are always mapped and always returned.

Only glibc has `mallopt`; elsewhere (musl, macOS) this does nothing and says so.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger(__name__)

# glibc's M_MMAP_THRESHOLD (malloc.h).
_M_MMAP_THRESHOLD = -3
# 1 MB: a hidden-state row block of a small model is under it, an activation of a batch
# over it; mapping a block costs a page fault per 4 KB touched, small beside the matmuls
# that fill it.
MMAP_THRESHOLD = 1 << 20

_tuned = False


def cpu_allocator_tune(*, threshold: int = MMAP_THRESHOLD) -> bool:
    """Fix glibc's mmap threshold at `threshold` bytes for this process (once); True when
    set, False where the C library has no `mallopt` or refuses."""
    global _tuned
    if _tuned:
        return True
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        log.info("no mallopt in the C library; a CPU trainer's freed tensors may stay resident")
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    if mallopt(_M_MMAP_THRESHOLD, threshold) != 1:
        log.info("mallopt(M_MMAP_THRESHOLD, %d) refused", threshold)
        return False
    _tuned = True
    return True
