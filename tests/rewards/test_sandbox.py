"""Submitted code runs confined: limits, no network, no host writes, killed on timeout."""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from apps.rewards.code_rules import code_exec
from apps.rewards.sandbox import code_extract, code_run, code_tests_normalise, sandbox_confinement

ADD_TESTS = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(2, 2) == 4"]
CONF = sandbox_confinement()
needs_netns = pytest.mark.skipif(not CONF.net_namespace, reason=f"no network namespace here: {CONF.describe()}")
needs_nobody = pytest.mark.skipif(not CONF.user_dropped, reason=f"cannot drop to nobody here: {CONF.describe()}")


def _task(tests: object) -> dict:
    return {"domain": "code", "prompt": "Write add(a, b).", "tests": tests}


@pytest.fixture
def marker() -> Iterator[Path]:
    # A path the host process may write, outside the sandbox's directory.
    path = Path(__file__).resolve().parents[2] / ".cache" / f"sandbox-marker-{uuid.uuid4().hex}"
    path.parent.mkdir(parents=True, exist_ok=True)
    yield path
    path.unlink(missing_ok=True)


@pytest.fixture
def listener() -> Iterator[tuple[int, list[int]]]:
    """A TCP server on the host's loopback that records every connection it gets (its peer's port)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.2)
    accepted: list[int] = []
    held: list[socket.socket] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, peer = server.accept()
                held.append(conn)
                accepted.append(peer[1])
            except OSError:
                continue

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1], accepted
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    server.close()


def nothing_connected_before_us(port: int, accepted: list[int]) -> list[int]:
    """The ports that reached the listener before a connection of our own, made now: the
    backlog hands connections out in the order they came, so one the sandboxed code made is
    accepted first. Waits for our own (the event), never for a guessed while."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as ours:
        mine = ours.getsockname()[1]
        deadline = time.monotonic() + 30
        while mine not in accepted:
            assert time.monotonic() < deadline, "the listener never accepted our own connection"
            time.sleep(0.01)
    return [peer for peer in accepted if peer != mine]


def test_code_exec_rewards_the_fraction_of_tests_passed() -> None:
    right = "```python\ndef add(a, b):\n    return a + b\n```"
    half = "def add(a, b):\n    return a + b if a > 0 else 99\n"
    assert code_exec(right, _task(ADD_TESTS)).score == 1.0
    result = code_exec(half, _task(ADD_TESTS))
    assert result.score == pytest.approx(2 / 3)
    assert result.parts == {"code_exec": pytest.approx(2 / 3)}


@pytest.mark.parametrize(
    "completion",
    ["def add(a, b) return a + b", "", "I don't know how to do that.", "```python\nraise SystemExit(0)\n```",
     "import sys\nsys.exit(0)"],
)
def test_malformed_or_evasive_code_scores_zero(completion: str) -> None:
    assert code_exec(completion, _task(ADD_TESTS)).score == 0.0


def test_a_task_without_usable_tests_scores_zero() -> None:
    code = "def add(a, b): return a + b"
    assert code_exec(code, _task(None)).score == 0.0
    assert code_exec(code, _task(42)).score == 0.0
    assert code_exec(code, _task([{"nonsense": 1}])).score == 0.0


def test_stdin_stdout_cases_compare_the_printed_output() -> None:
    code = "n = int(input())\nprint(n * 2)\n"
    tests = {"inputs": ["4\n", "5\n", "0\n"], "outputs": ["8\n", "11\n", "0"]}
    result = code_run(code=code, tests=tests)
    assert (result.passed, result.total) == (2, 3)
    assert result.errors[1] == "wrong output"


def test_code_extract_takes_the_last_python_block() -> None:
    text = "First try:\n```python\nx = 1\n```\nBetter:\n```py\nx = 2\n```\n```text\nnot code\n```"
    assert code_extract(text).strip() == "x = 2"
    assert code_extract("```\ny = 3\n```").strip() == "y = 3"
    assert code_extract("z = 4") == "z = 4"
    assert code_extract("```python\nunclosed") == "```python\nunclosed"


def test_code_tests_normalise_refuses_shapes_it_cannot_run() -> None:
    assert code_tests_normalise("assert True") == ["assert True"]
    assert code_tests_normalise({"input": "1", "output": "1"}) == [{"input": "1", "output": "1"}]
    with pytest.raises(ValueError):
        code_tests_normalise({"unknown": []})
    with pytest.raises(ValueError):
        code_tests_normalise([1, 2])


@pytest.mark.timeout(30)
def test_an_infinite_loop_is_killed_at_the_wall_timeout() -> None:
    started = time.monotonic()
    result = code_run(code="while True:\n    pass\n", tests=["assert True"], timeout=2.0)
    assert time.monotonic() - started < 8
    assert result.timed_out and result.passed == 0
    assert result.returncode is not None and result.returncode < 0


@pytest.mark.timeout(30)
def test_a_looping_test_fails_alone_and_the_others_still_count() -> None:
    code = "def f(x):\n    while x == 0:\n        pass\n    return x\n"
    tests = ["assert f(1) == 1", "assert f(0) == 0", "assert f(2) == 2"]
    result = code_run(code=code, tests=tests, timeout=10.0, test_timeout=1.0)
    assert (result.passed, result.total) == (2, 3)
    assert result.errors[1] == "timeout"


@pytest.mark.timeout(30)
def test_a_loop_that_swallows_the_test_alarm_is_still_killed() -> None:
    code = "import signal\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\ndef f():\n    while True:\n        pass\n"
    result = code_run(code=code, tests=["f()", "assert True"], timeout=3.0, test_timeout=0.5)
    assert result.timed_out and result.passed == 0


def test_os_system_is_refused_and_the_host_untouched(marker: Path) -> None:
    code = f"import os\ndef f():\n    return os.system('touch {marker}')\n"
    result = code_run(code=code, tests=["assert f() == 0"])
    assert result.passed == 0
    assert "os.system is not allowed" in result.errors[0]
    assert not marker.exists()


@needs_nobody
def test_without_the_audit_hook_os_system_still_cannot_write_the_host(marker: Path) -> None:
    code = f"import os\ndef f():\n    return os.system('touch {marker}')\n"
    result = code_run(code=code, tests=["assert f() == 0"], audit=False)
    assert result.passed == 0
    assert not marker.exists()


def test_writing_files_outside_the_sandbox_directory_is_refused(marker: Path) -> None:
    code = f"def f():\n    open('scratch.txt', 'w').write('ok')\n    open({str(marker)!r}, 'w').write('pwned')\n"
    result = code_run(code=code, tests=["f()"])
    assert result.passed == 0 and "not allowed" in result.errors[0]
    assert not marker.exists()


def test_sockets_are_refused(listener: tuple[int, list[int]]) -> None:
    port, accepted = listener
    code = f"import socket\ndef f():\n    socket.create_connection(('127.0.0.1', {port}), timeout=2).sendall(b'x')\n"
    result = code_run(code=code, tests=["f()"])
    assert result.passed == 0
    assert "not allowed" in result.errors[0]
    assert nothing_connected_before_us(port, accepted) == []


@needs_netns
def test_without_the_audit_hook_the_network_namespace_still_blocks_sockets(
    listener: tuple[int, list[int]],
) -> None:
    port, accepted = listener
    code = f"import socket\ndef f():\n    socket.create_connection(('127.0.0.1', {port}), timeout=2).sendall(b'x')\n"
    result = code_run(code=code, tests=["f()"], audit=False)
    assert result.passed == 0
    assert "unreachable" in result.errors[0].lower() or "refused" in result.errors[0].lower()
    assert nothing_connected_before_us(port, accepted) == []


def test_subprocess_fork_and_ctypes_are_refused() -> None:
    tests = [
        "import subprocess\nsubprocess.run(['true'])",
        "import os\nos.fork()",
        "import ctypes",
        "import os\nos.kill(1, 9)",
    ]
    result = code_run(code="", tests=tests)
    assert result.passed == 0
    assert all("not allowed" in e for e in result.errors), result.errors


@pytest.mark.timeout(30)
def test_memory_is_limited() -> None:
    result = code_run(code="def f():\n    return bytearray(2 * 1024**3)\n", tests=["f()", "assert True"], memory_mb=256)
    assert result.passed == 1
    assert "MemoryError" in result.errors[0]


@pytest.mark.timeout(30)
def test_a_huge_output_is_capped() -> None:
    code = "def f():\n    while True:\n        print('x' * 10000)\n"
    result = code_run(code=code, tests=["f()", "assert True"], max_output_bytes=64 * 1024)
    assert result.passed == 1
    assert "File too large" in result.errors[0] or "Errno 27" in result.errors[0]
    assert len(result.output_tail) <= 2000


def test_the_environment_is_stripped_and_the_cwd_is_private() -> None:
    os.environ["RFT_SANDBOX_SECRET_FOR_TEST"] = "s3cret"
    try:
        tests = [
            "import os\nassert 'RFT_SANDBOX_SECRET_FOR_TEST' not in os.environ",
            "import os\nassert sorted(os.listdir('.')) == ['runner.py', 'solution.py', 'tests.json']",
            "import sys\nassert sys.flags.isolated == 1",
        ]
        result = code_run(code="", tests=tests)
    finally:
        del os.environ["RFT_SANDBOX_SECRET_FOR_TEST"]
    assert result.passed == 3, result.errors


def test_an_early_exit_keeps_the_verdicts_already_given() -> None:
    result = code_run(code="", tests=["assert True", "import os\nos._exit(0)", "assert True"])
    assert (result.passed, result.total) == (1, 3)
    assert "no verdict" in result.errors[2]
