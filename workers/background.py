"""Work a worker hands to a thread of its own so that its step goes on meanwhile (the trainer's
journal entries, the handover's checkpoint files): one single-thread executor per name, so
each name's jobs run in the order they were given."""

from __future__ import annotations

import functools
from concurrent.futures import ThreadPoolExecutor


@functools.cache
def background_writer(name: str) -> ThreadPoolExecutor:
    """The executor `name` (its thread's name prefix), made on first use: in the worker
    process, not before a prefork pool forks."""
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
