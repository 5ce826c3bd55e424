"""Running untrusted code against tests in a confined child process.

Layers, each used when this host allows it (`sandbox_confinement()` measures once per
process which ones work, and logs it):

1. Resource limits set in the child before exec: CPU seconds, address space, file size
   (caps output too), open files, no core dumps; processes per user once the user is dropped.
2. A new session and process group, killed as a whole (SIGKILL) on the wall timeout.
3. `unshare --net --pid --fork --kill-child` (root or CAP_SYS_ADMIN; unprivileged users get
   `--user --map-root-user` when user namespaces are allowed): an empty network namespace
   (no interface but a downed loopback, so nothing is reachable) and a pid namespace whose
   every process dies with the child, even one that left the process group.
4. As root, `setpriv` drops to `nobody` with no-new-privs, so the code cannot write what
   `nobody` cannot (the project, other users' files) and RLIMIT_NPROC stops fork bombs.
   The interpreter must be runnable by nobody: the first of RFT_SANDBOX_PYTHON,
   sys.executable and the system python3 that is.
5. `python -I -S -B` (isolated: no env vars, no user site, no site-packages, no bytecode
   writes) in a fresh temporary directory as cwd, with an environment of PATH/LANG/HOME only,
   and an audit hook (see sandbox_runner.py) that refuses sockets, subprocesses, os.system,
   fork/exec, ctypes and writes outside the directory before the submitted code runs.

Measured on the development host (root in a container, util-linux present): all five.
Where namespaces are refused (a locked-down container), layers 1, 2, 4 and 5 remain and
the audit hook alone keeps sockets closed.

Known limit: the verdicts travel over a file descriptor that the submitted code shares a
process with, so code written to forge verdicts could claim passes; it cannot reach the host.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings

log = logging.getLogger(__name__)

RUNNER = Path(__file__).with_name("sandbox_runner.py")
NOBODY_UID = 65534
NOBODY_GID = 65534
MAX_TESTS = 500
# A test: an assertion snippet, or an {"input", "output"} case.
TestCase = str | dict[str, object]
ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}


@dataclass(frozen=True)
class Confinement:
    python: str
    # Argument prefix that puts the child in fresh net and pid namespaces; empty when refused.
    namespaces: tuple[str, ...] = ()
    # Argument prefix that drops to nobody; empty when not root or no interpreter allows it.
    drop_user: tuple[str, ...] = ()

    @property
    def net_namespace(self) -> bool:
        return bool(self.namespaces)

    @property
    def user_dropped(self) -> bool:
        return bool(self.drop_user)

    def describe(self) -> str:
        return (
            f"python={self.python}; network namespace={'yes' if self.namespaces else 'no (audit hook only)'}; "
            f"runs as nobody={'yes' if self.drop_user else 'no'}; rlimits, process-group kill, audit hook: yes"
        )


@dataclass(frozen=True)
class CodeRunResult:
    passed: int
    total: int
    timed_out: bool = False
    compile_error: str = ""
    errors: list[str] = field(default_factory=list)
    returncode: int | None = None
    seconds: float = 0.0
    output_tail: str = ""

    @property
    def fraction(self) -> float:
        return self.passed / self.total if self.total else 0.0


def _probe(argv: list[str], cwd: str) -> bool:
    try:
        done = subprocess.run(argv, cwd=cwd, env=ENV, capture_output=True, timeout=20, check=False)
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


@functools.cache
def sandbox_confinement() -> Confinement:
    """Measure which confinement layers this host allows (once per process)."""
    unshare, setpriv = shutil.which("unshare"), shutil.which("setpriv")
    root = os.geteuid() == 0
    candidates = [settings.RFT_SANDBOX_PYTHON, sys.executable, shutil.which("python3") or ""]
    candidates = list(dict.fromkeys(c for c in candidates if c))
    namespaces: tuple[str, ...] = ()
    drop: tuple[str, ...] = ()
    python = candidates[0]
    with tempfile.TemporaryDirectory(prefix="rft-probe-") as tmp:
        if unshare:
            options = [["--net", "--pid", "--fork", "--kill-child"]]
            if not root:
                options.insert(0, ["--user", "--map-root-user", "--net", "--pid", "--fork", "--kill-child"])
            for opts in options:
                prefix = (unshare, *opts, "--")
                if _probe([*prefix, python, "-I", "-S", "-c", "pass"], tmp):
                    namespaces = prefix
                    break
        if root and setpriv:
            os.chown(tmp, NOBODY_UID, NOBODY_GID)
            prefix = (setpriv, f"--reuid={NOBODY_UID}", f"--regid={NOBODY_GID}", "--clear-groups", "--no-new-privs", "--")
            for candidate in candidates:
                if _probe([*namespaces, *prefix, candidate, "-I", "-S", "-B", "-c", "import json, io"], tmp):
                    drop, python = prefix, candidate
                    break
    found = Confinement(python=python, namespaces=namespaces, drop_user=drop)
    log.info("code sandbox: %s", found.describe())
    return found


def code_extract(completion: str) -> str:
    """The code in a completion: its last ```python (or ```py / bare ```) block, else all of it."""
    blocks: list[tuple[str, str]] = []
    pos = 0
    while True:
        start = completion.find("```", pos)
        if start < 0:
            break
        line_end = completion.find("\n", start)
        if line_end < 0:
            break
        end = completion.find("```", line_end + 1)
        if end < 0:
            break
        lang = completion[start + 3 : line_end].strip().lower()
        blocks.append((lang, completion[line_end + 1 : end]))
        pos = end + 3
    python = [body for lang, body in blocks if lang in ("python", "py", "python3")]
    if python:
        return python[-1]
    bare = [body for lang, body in blocks if not lang]
    return bare[-1] if bare else completion


def code_tests_normalise(tests: object) -> list[TestCase]:
    """Task tests as a list: assertion snippets (str) and/or {"input", "output"} cases."""
    if tests is None:
        return []
    if isinstance(tests, str):
        return [tests] if tests.strip() else []
    if isinstance(tests, dict):
        if "input" in tests and "output" in tests:
            return [tests]
        # {"inputs": [...], "outputs": [...]} as in APPS / TACO style datasets.
        if isinstance(tests.get("inputs"), list) and isinstance(tests.get("outputs"), list):
            return [{"input": i, "output": o} for i, o in zip(tests["inputs"], tests["outputs"], strict=False)]
        raise ValueError("tests must be a list of assertions or {input, output} cases")
    if isinstance(tests, list):
        for t in tests:
            if not (isinstance(t, str) or (isinstance(t, dict) and "output" in t)):
                raise ValueError("each test must be an assertion (text) or an {input, output} case")
        return list(tests)
    raise ValueError(f"tests must be a list, not {type(tests).__name__}")


def _limits(*, cpu_seconds: int, memory_bytes: int, file_bytes: int, nproc: int | None) -> Callable[[], None]:
    def apply() -> None:
        # Soft equals hard: the code cannot raise them back.
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds))
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
        resource.setrlimit(resource.RLIMIT_FSIZE, (file_bytes, file_bytes))
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if nproc is not None:
            # Counted per user: only meaningful (and only set) once we run as nobody.
            resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))

    return apply


def _read_tail(path: Path, limit: int = 2000) -> str:
    try:
        with path.open("rb") as f:
            f.seek(max(0, path.stat().st_size - limit))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def code_run(
    *,
    code: str,
    tests: object,
    timeout: float = 10.0,
    test_timeout: float = 4.0,
    memory_mb: int = 512,
    max_output_bytes: int = 1 << 20,
    audit: bool = True,
) -> CodeRunResult:
    """Run `code` against `tests` in a confined child; verdicts per test, never raises for bad code.

    `audit=False` leaves out the in-process audit hook, so tests can show that the
    process-level layers confine on their own.
    """
    cases = code_tests_normalise(tests)[:MAX_TESTS]
    if not cases:
        return CodeRunResult(passed=0, total=0)
    conf = sandbox_confinement()
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="rft-sbx-"))
    # Verdicts go to a file in a directory of ours that the child never gets the path of.
    private = Path(tempfile.mkdtemp(prefix="rft-sbx-out-"))
    try:
        _work_fill(work, code=code, cases=cases, test_timeout=test_timeout, audit=audit, drop_user=bool(conf.drop_user))
        verdicts_path, output_path = private / "verdicts", private / "output"
        verdicts_fd = os.open(verdicts_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        output = output_path.open("wb")
        try:
            cpu = int(timeout) + 1
            argv = [*conf.namespaces, *conf.drop_user, conf.python, "-I", "-S", "-B", "runner.py", str(verdicts_fd)]
            proc = subprocess.Popen(
                argv,
                cwd=work,
                env={**ENV, "HOME": str(work), "TMPDIR": str(work)},
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                pass_fds=(verdicts_fd,),
                start_new_session=True,
                preexec_fn=_limits(  # noqa: PLW1509 - rlimits must be set between fork and exec
                    cpu_seconds=cpu,
                    memory_bytes=memory_mb * 1024 * 1024,
                    file_bytes=max_output_bytes,
                    nproc=64 if conf.drop_user else None,
                ),
            )
        finally:
            os.close(verdicts_fd)
            output.close()
        timed_out = _child_wait(proc, timeout=timeout)
        return _verdicts(
            verdicts_path,
            total=len(cases),
            timed_out=timed_out,
            returncode=proc.returncode,
            seconds=time.monotonic() - started,
            output_tail=_read_tail(output_path),
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(private, ignore_errors=True)


def _work_fill(work: Path, *, code: str, cases: list[TestCase], test_timeout: float, audit: bool,
               drop_user: bool) -> None:
    """The child's directory: the solution, its tests and the runner (without the audit hook
    for audit=False), private to it (owned by nobody where it runs as nobody)."""
    (work / "solution.py").write_text(code, encoding="utf-8")
    (work / "tests.json").write_text(json.dumps({"tests": cases, "test_timeout": test_timeout}), encoding="utf-8")
    runner = RUNNER.read_text(encoding="utf-8")
    if not audit:
        runner = runner.replace("    sys.addaudithook(_hook_for(root))\n", "")
    (work / "runner.py").write_text(runner, encoding="utf-8")
    os.chmod(work, 0o700)
    if drop_user:
        for path in [work, *work.iterdir()]:
            os.chown(path, NOBODY_UID, NOBODY_GID)


def _child_wait(proc: subprocess.Popen[bytes], *, timeout: float) -> bool:
    """Wait for the child up to `timeout`; True when it ran out. Its process group is killed
    either way: also on a normal exit, anything it left running in its group goes too."""
    timed_out = False
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()
    return timed_out


def _verdicts(path: Path, *, total: int, timed_out: bool, returncode: int | None, seconds: float,
              output_tail: str) -> CodeRunResult:
    verdict: dict[int, bool] = {}
    errors: list[str] = [""] * total
    compile_error = ""
    # Bounded: the child's RLIMIT_FSIZE capped the file, and we read no more than that.
    with path.open("rb") as f:
        raw = f.read(4 * 1024 * 1024)
    for line in raw.decode("utf-8", "replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if not isinstance(record, dict):
            continue
        if "compile_error" in record:
            compile_error = str(record["compile_error"])[:500]
            continue
        i = record.get("i")
        if isinstance(i, int) and 0 <= i < total and i not in verdict:
            verdict[i] = record.get("ok") is True
            errors[i] = str(record.get("err", ""))[:300]
    for i in range(total):
        if i not in verdict:
            errors[i] = errors[i] or ("timeout" if timed_out else "no verdict (the process died)")
    return CodeRunResult(
        passed=sum(verdict.values()),
        total=total,
        timed_out=timed_out,
        compile_error=compile_error,
        errors=errors,
        returncode=returncode,
        seconds=seconds,
        output_tail=output_tail,
    )
