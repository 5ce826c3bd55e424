"""`python tests/child_guard.py CMD…`: run CMD so that it dies with the test process that
started it, however that process ends (tests/servers.py starts every server and worker so).

The guard is started in a process group of its own (start_new_session) and runs CMD in that
group; CMD's own children (the beat process a worker forks) stay in it too. The guard waits
for CMD and exits with its status, so the caller's Popen stands for CMD. When its parent,
the test process, is gone (killed with SIGKILL, say: no fixture teardown runs), the guard
is handed to another parent: it then SIGKILLs the whole group. A killed `make test` so
leaves no worker holding the test database for the next run to trip on.

Why not PR_SET_PDEATHSIG on the worker itself: it reaches one process, not the children it
forks, and fires when the forking *thread* ends, not the process. Polling the parent's pid
from a process that leads the group covers both, on any POSIX system.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

POLL_SECONDS = 0.2


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python tests/child_guard.py CMD [ARG…]", file=sys.stderr)
        return 2
    parent = os.getppid()
    # A SIGTERM or SIGINT to the group reaches CMD itself; the guard stays to report CMD's end.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, preexec_fn=_default_signals)
    while True:
        try:
            status = child.wait(timeout=POLL_SECONDS)
            break
        except subprocess.TimeoutExpired:
            pass
        if os.getppid() != parent:
            os.killpg(os.getpgrp(), signal.SIGKILL)  # CMD, its children, and the guard last
    if status < 0:  # CMD died of a signal: so does the guard, for the caller's returncode
        _default_signals()
        os.kill(os.getpid(), -status)
    return status


def _default_signals() -> None:
    for number in (signal.SIGTERM, signal.SIGINT):
        signal.signal(number, signal.SIG_DFL)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
