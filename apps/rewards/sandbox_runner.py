"""Runs inside the sandbox child (stdlib only, Python 3.8+): the submitted code against its
tests, one verdict line per test on a result file descriptor.

Started as `python -I -S -B sandbox_runner.py <fd>` in a private temporary directory that
holds `solution.py` and `tests.json`. Before the submitted code runs, an audit hook refuses
processes, sockets, ctypes and writes outside that directory. The hook is one layer of
several (see apps/rewards/sandbox.py); on its own it is not a security boundary.
"""

from __future__ import annotations  # annotations stay strings: the child may be Python 3.8

import io
import json
import os
import signal
import sys
from types import FrameType
from typing import Callable

BLOCKED_EVENTS = {
    "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty", "os.kill", "os.killpg",
    "subprocess.Popen", "pty.spawn", "os.setuid", "os.setgid", "os.chroot", "os.startfile",
    "resource.setrlimit", "resource.prlimit",
}
BLOCKED_PREFIXES = ("socket.", "ctypes.", "winreg.", "webbrowser.")
BLOCKED_IMPORTS = {"_posixsubprocess", "_ctypes", "_socket", "_ssl", "pty", "_multiprocessing", "resource"}
PATH_EVENTS = {
    "os.remove", "os.rmdir", "os.rename", "os.link", "os.symlink", "os.truncate", "os.chmod", "os.chown",
    "os.mkdir", "os.utime", "shutil.rmtree", "shutil.copyfile", "shutil.move", "shutil.copymode",
    "shutil.copystat", "shutil.chown", "os.chflags", "os.lchflags", "os.setxattr", "os.removexattr",
}


def _inside(root: str, path: object) -> bool:
    if isinstance(path, int):
        return True
    try:
        name = os.fsdecode(os.fspath(path))  # type: ignore[call-overload]  # any path-like the audit event carries
    except TypeError:
        return True
    full = os.path.realpath(os.path.join(os.getcwd(), name))
    return full == root or full.startswith(root + os.sep) or full == os.devnull


def _hook_for(root: str) -> Callable[[str, tuple[object, ...]], None]:
    def hook(event: str, args: tuple[object, ...]) -> None:
        if event in BLOCKED_EVENTS or event.startswith(BLOCKED_PREFIXES):
            raise PermissionError("sandbox: %s is not allowed" % event)
        if event == "import" and args and args[0] in BLOCKED_IMPORTS:
            raise PermissionError("sandbox: import of %s is not allowed" % args[0])
        if event == "open" and len(args) >= 3:
            path, mode, flags = args[0], args[1], args[2]
            writes = (mode is not None and any(c in str(mode) for c in "wax+")) or (
                mode is None and isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC)
            )
            if writes and not _inside(root, path):
                raise PermissionError("sandbox: writing %r is not allowed" % (path,))
        elif event in PATH_EVENTS:
            for arg in args:
                if isinstance(arg, (str, bytes, os.PathLike)) and not _inside(root, arg):
                    raise PermissionError("sandbox: %s on %r is not allowed" % (event, arg))

    return hook


class _TestTimeout(BaseException):
    # BaseException: a bare `except Exception` in the submission must not swallow it.
    pass


def _on_alarm(signum: int, frame: FrameType | None) -> None:
    raise _TestTimeout()


def _same_output(got: str, want: str) -> bool:
    def lines(s: str) -> list[str]:
        return [line.rstrip() for line in s.strip().splitlines()]

    return lines(got) == lines(want)


def main() -> None:
    out = os.fdopen(int(sys.argv[1]), "w", buffering=1)
    with open("tests.json") as f:
        spec = json.load(f)
    with open("solution.py") as f:
        source = f.read()
    tests, test_timeout = spec["tests"], float(spec["test_timeout"])
    root = os.path.realpath(os.getcwd())

    def emit(record: dict[str, object]) -> None:
        out.write(json.dumps(record) + "\n")
        out.flush()

    try:
        code = compile(source, "solution.py", "exec")
    except (SyntaxError, ValueError) as exc:
        emit({"compile_error": "%s: %s" % (type(exc).__name__, exc)})
        return
    # Output past RLIMIT_FSIZE makes write() fail instead of killing us without verdicts.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    signal.signal(signal.SIGALRM, _on_alarm)
    real_stdin, real_stdout = sys.stdin, sys.stdout
    sys.addaudithook(_hook_for(root))
    for i, test in enumerate(tests):
        ok, err = False, ""
        signal.setitimer(signal.ITIMER_REAL, test_timeout)
        try:
            if isinstance(test, dict):
                sys.stdin = io.StringIO(str(test.get("input", "")))
                sys.stdout = captured = io.StringIO()
                try:
                    exec(code, {"__name__": "__main__", "__builtins__": __builtins__})
                finally:
                    sys.stdin, sys.stdout = real_stdin, real_stdout
                ok = _same_output(captured.getvalue(), str(test.get("output", "")))
                if not ok:
                    err = "wrong output"
            else:
                namespace = {"__name__": "__solution__", "__builtins__": __builtins__}
                exec(code, namespace)
                exec(compile(str(test), "test_%d" % i, "exec"), namespace)
                ok = True
        except _TestTimeout:
            err = "timeout"
        except BaseException as exc:  # noqa: BLE001 - SystemExit and friends fail the test, nothing more
            err = ("%s: %s" % (type(exc).__name__, exc))[:300]
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            sys.stdin, sys.stdout = real_stdin, real_stdout
        emit({"i": i, "ok": ok, "err": err})
    emit({"done": True})


if __name__ == "__main__":
    main()
