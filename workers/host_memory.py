"""Host memory of a trainer on the CPU: large tensors go back to the system when freed.

PyTorch's CPU allocator is glibc's malloc. glibc serves a block at or above its mmap
threshold with its own mapping (returned on free), and below it from a heap (kept). The
threshold is dynamic: freeing a mapped block raises it to that block's size (up to 32 MB),
so after the first step every activation, logits tile and gradient under 32 MB comes from
the heap, and a step's transient tensors stay resident as fragments the next step only
partly reuses. On a ~100M-parameter Qwen2 step that kept 150-250 MB resident above the live
tensors, and set the peak (bench/trainer_memory). A fixed threshold turns the adjustment
off: blocks of `MMAP_THRESHOLD` and more are always mapped and always returned.

Blocks under the threshold still come from the heap, and a freed one stays resident until
the heap is trimmed. A learner gang's rank trains on its part of the batch, so most of its
saved activations are under 1 MB (2 of the ~100M bench model's 4 rows: 0.6 MB a hidden
state): the backward freed them into the heap while it added the gradients, and they stayed
resident through the step's peak (~120 MB of free heap per rank, bench/sharding --phases).
A tuned process also trims the heap (`malloc_trim`, which hands a free page in the middle of
the heap back too) after each decoder block's backward (`backward_trim`): a rank's peak
958-960 MB against 1068-1080 MB untrimmed, its step 10.6-11.3 s against 8.9-9.9 s (the
trimmed pages fault in again; trim and no trim in turn at load 7-8).

A learner gang's rank holds 1/world of each of the step's tensors that set its peak: its
rows of the batch (activations) and its shard of each gradient. At the one process's
threshold, the rank's counterparts of blocks one process maps fall under it: at 350M on 2
ranks and 1 MB, a half batch's hidden states (0.79 MB) and the K/V gradient shards (0.5 MB)
come from the heap (one process maps both), and ~345 MB of heap stayed resident from the
second step's backward through its optimizer step (bench/sharding --phases, 0.66x one
process's peak; every process at 256 KB: 0.61x). So a rank's threshold is the worker's scaled by its share
(`rank_mmap_threshold`): it maps what corresponds to what one process maps.

Only glibc has `mallopt`; elsewhere (musl, macOS) this does nothing and says so.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from torch.utils.hooks import RemovableHandle

log = logging.getLogger(__name__)

# glibc's M_MMAP_THRESHOLD (malloc.h).
_M_MMAP_THRESHOLD = -3
# 1 MB: a hidden-state row block of a small model is under it, an activation of a batch
# over it; mapping a block costs a page fault per 4 KB touched, small beside the matmuls
# that fill it.
MMAP_THRESHOLD = 1 << 20

# glibc's own starting threshold (DEFAULT_MMAP_THRESHOLD_MIN, 128 KB): a rank's scaled
# threshold stops there, so a many-rank gang never maps a block that an untuned process
# would serve from its heap, where a mapping's page faults would cost more than it keeps.
RANK_MMAP_THRESHOLD_MIN = 128 << 10

_tuned = False
# The threshold set (the lowest asked for, `cpu_allocator_tune`).
_threshold = 0
# The C library, once `cpu_allocator_tune` has tuned it: `heap_trim` trims only then.
_libc: ctypes.CDLL | None = None


def rank_mmap_threshold(threshold: int, *, world: int) -> int:
    """The mmap threshold of one of `world` ranks of a learner gang in a worker whose
    threshold is `threshold` (RFT_TRAINER_CPU_MMAP_THRESHOLD; 0: off, stays off): scaled
    by the rank's share of the batch and of each gradient, not under
    RANK_MMAP_THRESHOLD_MIN (nor above `threshold`)."""
    if threshold <= 0 or world <= 1:
        return threshold
    return min(threshold, max(RANK_MMAP_THRESHOLD_MIN, threshold // world))


def cpu_allocator_tune(*, threshold: int = MMAP_THRESHOLD) -> bool:
    """Fix glibc's mmap threshold at `threshold` bytes for this process; True when set,
    False where the C library has no `mallopt` or refuses. Process-wide: once tuned, a
    higher threshold changes nothing and a lower one is set (a train worker that holds a
    learner gang's rank 0 and a one-process run keeps the rank's, which maps the other
    run's blocks in that range too: page faults, never memory kept)."""
    global _tuned, _libc, _threshold
    if _tuned and threshold >= _threshold:
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
    _libc = libc
    _threshold = threshold
    return True


def heap_trim() -> None:
    """Hand the heap's free pages back to the system (glibc's `malloc_trim`), in a process
    whose allocator `cpu_allocator_tune` has tuned; elsewhere nothing."""
    if _libc is not None:
        _libc.malloc_trim(0)


def backward_trim(blocks: Sequence[torch.nn.Module]) -> list[RemovableHandle]:
    """In a tuned process, trim the heap each time the backward has gone through one of
    `blocks` (a model's decoder layers), when the activations it saved are freed: a hook on
    the gradient of the block's input, set as the block runs with gradients. Returns the
    hooks' handles (none in an untuned process)."""
    if _libc is None:
        return []

    def trim(_grad: torch.Tensor) -> None:
        heap_trim()

    def on_forward(_module: torch.nn.Module, args: tuple[object, ...], kwargs: dict[str, object]) -> None:
        import torch

        hidden = args[0] if args else kwargs.get("hidden_states")
        if torch.is_grad_enabled() and isinstance(hidden, torch.Tensor) and hidden.requires_grad:
            hidden.register_hook(trim)

    return [b.register_forward_pre_hook(on_forward, with_kwargs=True) for b in blocks]
