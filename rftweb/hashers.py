"""Password hashing that gives way to the people already working (issue #49 item 5).

A login checks a PBKDF2 hash: ~0.2 s of one core, by design. When a team logs in at once (140
logins in 30 s in bench/web_load), those derivations took most of the web tier's CPU, and the
annotation page of the people who had just logged in waited behind them (p99 2.0 s on a quiet
2-core host). `NicePBKDF2PasswordHasher` is Django's PBKDF2 hasher, same algorithm name and same
hashes (stored passwords need no upgrade), with the derivation run on a small pool of threads
whose scheduling priority is lowered by `RFT_PASSWORD_HASH_NICE` (Linux schedules threads on
their own nice values; hashlib releases the GIL while it derives). Under contention the
requests of people labelling go first and logins take longer; on an idle host nothing changes.
Where a thread's nice cannot be set (not Linux), the pool's threads run at the caller's
priority and only the hand-off remains.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from functools import cache

from django.conf import settings
from django.contrib.auth.hashers import PBKDF2PasswordHasher

# Two derivations at a time per process: more only splits the same spare CPU between more
# logins, each finishing later.
POOL_THREADS = 2


def thread_priority_lower() -> None:
    """Lower the calling thread's priority by RFT_PASSWORD_HASH_NICE (a pool's initializer)."""
    step = int(settings.RFT_PASSWORD_HASH_NICE)
    if step <= 0 or not hasattr(os, "setpriority"):
        return
    thread = threading.get_native_id()
    try:
        # PRIO_PROCESS with a thread id: Linux applies it to that thread only.
        os.setpriority(os.PRIO_PROCESS, thread, os.getpriority(os.PRIO_PROCESS, thread) + step)
    except OSError:
        pass  # a platform that refuses: the derivations run at the caller's priority


@cache
def hash_pool() -> ThreadPoolExecutor:
    """This process's pool, made at the first login (after a server's fork, never before it)."""
    return ThreadPoolExecutor(max_workers=POOL_THREADS, thread_name_prefix="password-hash",
                              initializer=thread_priority_lower)


class NicePBKDF2PasswordHasher(PBKDF2PasswordHasher):
    """Django's PBKDF2-SHA256 (algorithm `pbkdf2_sha256`), derived on a lower-priority thread."""

    def encode(self, password: str, salt: str, iterations: int | None = None) -> str:
        derive = super().encode
        return hash_pool().submit(derive, password, salt, iterations).result()
