"""Every command the README and the docs site (docs/, bench/README.md) show runs as written, from the checkout's root as a person who
just cloned it would type it (`python` being the venv's). A command that would start a
server, train or build a model is asked for its `--help`; a make target is dry-run (`make -n`);
the rest run whole. New commands in the README are picked up by the reader below, so a
documented command that breaks fails here."""

from __future__ import annotations

import itertools
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
# The pages people read commands from: the README, the docs site's pages (not the generated
# reference, whose usage lines are argparse's own) and the benches' page.
PAGES = [README, ROOT / "bench" / "README.md",
         *sorted(p for p in (ROOT / "docs").rglob("*.md") if "reference" not in p.relative_to(ROOT / "docs").parts)]
# A command starts with one of these, perhaps after VAR='…' assignments.
_COMMAND = re.compile(r"^(?:[A-Z_]+=(?:'[^']*'|\S+)\s+)*(?:make|python|manage\.py|rft(?:_[a-z_]+)?)(?:\s|$)")
_FENCE = re.compile(r"^```(\w*)\s*$")
# Commands that finish quickly and touch nothing outside the paths they are given: run whole.
_RUN_WHOLE = ("-m pytest", "-m apps.rewards.k12_taskset", "manage.py check")


def documented_commands() -> list[str]:
    """The pages' commands: inline code spans and lines of plain (no-language) code blocks."""
    found: list[str] = []
    for page in PAGES:
        block: str | None = None  # the info string of the fenced block we are in
        for line in page.read_text().splitlines():
            fence = _FENCE.match(line)
            if fence:
                block = None if block is not None else fence.group(1)
                continue
            if block == "":
                found.append(line.strip())
            elif block is None:
                found += re.findall(r"`([^`\n]+)`", line)
    return sorted({c for c in found if _COMMAND.match(c)})


def _expand(command: str) -> list[str]:
    """`rft create|start` stands for two commands."""
    words = [word.split("|") if re.fullmatch(r"[a-z_-]+(\|[a-z_-]+)+", word) else [word] for word in command.split()]
    return [" ".join(choice) for choice in itertools.product(*words)]


def invocation(command: str, tmp: Path) -> tuple[list[str], dict[str, str]]:
    """The argv and extra environment that run `command` as this test means to."""
    env: dict[str, str] = {}
    words = shlex.split(command.replace("…", "x"))
    while words and re.fullmatch(r"[A-Z_]+=.*", words[0]):
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    if words[0] == "make":
        return ["make", "-n", *words[1:]], env
    if words[0].startswith("rft"):  # the README's shorthand for `manage.py rft …`
        words = ["manage.py", *words]
    if words[0] == "manage.py":
        words = ["python", *words]
    words[0] = sys.executable
    if any(marker in command for marker in _RUN_WHOLE):
        # Relative output paths go to the test's own directory, not the checkout.
        return [str(tmp / w) if w.endswith(".jsonl") else w for w in words], env
    # The program and its subcommands: the words up to the first option or placeholder.
    head = list(itertools.takewhile(lambda w: re.fullmatch(r"[a-z_][a-z0-9_./-]*", w) is not None, words[1:]))
    return [words[0], *head, "--help"], env


def test_the_reader_finds_the_commands_people_are_told_to_run() -> None:
    commands = documented_commands()
    # The reader must see the kinds of command the pages are known to show; if it finds
    # none of a kind, it is the reader that broke, not the pages.
    assert any(c.startswith("make ") for c in commands), commands
    assert any("manage.py rft " in c for c in commands), commands
    assert any(c.startswith("python examples/") for c in commands), commands
    assert len(commands) >= 10, commands


_ALL = [c for doc in documented_commands() for c in _expand(doc)]
_Key = tuple[tuple[str, ...], tuple[tuple[str, str], ...]]  # an invocation's argv and extra environment
# What each distinct invocation did: the pages show many commands that this test turns into
# the same one (`rft create …` with other options is `rft create --help` each time; 54
# commands, 39 invocations), run once and judged for each.
_DONE: dict[_Key, subprocess.CompletedProcess[str]] = {}

# The `manage.py …` invocations (20 of the 39) run in one interpreter, one after another, each
# with its own argv and its own output: each in a process of its own started Django again
# (~2 s of CPU apiece, a third of the module's time). What a person's shell gives them is the
# same: the checkout as the working directory, the environment below, `manage.py` as argv[0]
# (rftweb/settings.py reads it) when settings are first read.
_MANAGE_BATCH = """
import contextlib, io, json, os, sys, traceback
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "rftweb.settings")
from django.core.management import execute_from_command_line
done, results = [], sys.argv[1]
for argv in json.loads(sys.stdin.read()):
    sys.argv = list(argv)
    out, err, code = io.StringIO(), io.StringIO(), 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            execute_from_command_line(sys.argv)
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        except BaseException:
            traceback.print_exc()
            code = 1
    done.append([code, out.getvalue(), err.getvalue()])
with open(results, "w") as file:
    json.dump(done, file)
"""


def _fresh_shell(extra: dict[str, str]) -> dict[str, str]:
    env = {**os.environ, **extra}
    # A fresh shell: nothing put on the path by pytest, so an example that cannot find the
    # project fails here as it would for a person.
    env.pop("PYTHONPATH", None)
    env.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)  # pytest-django's, which `check --deploy` rightly refuses
    return env


def _manage_batch(tmp: Path) -> None:
    """Every documented `manage.py` invocation without extra environment, run in one
    interpreter; each one's exit status and output kept in _DONE."""
    keys: dict[_Key, None] = {}
    for command in _ALL:
        argv, extra = invocation(command, tmp)
        if not extra and argv[1:2] == ["manage.py"]:
            keys[(tuple(argv), ())] = None
    results = tmp / "manage-batch.json"
    batch = subprocess.run([sys.executable, "-c", _MANAGE_BATCH, str(results)],
                           input=json.dumps([list(k[0][1:]) for k in keys]), cwd=ROOT, env=_fresh_shell({}),
                           capture_output=True, text=True, timeout=600)
    assert batch.returncode == 0, f"the manage.py batch stopped: {batch.stderr[-3000:]}"
    for key, (code, out, err) in zip(keys, json.loads(results.read_text()), strict=True):
        _DONE[key] = subprocess.CompletedProcess(list(key[0]), code, out, err)


@pytest.mark.parametrize("command", _ALL, ids=[c.replace("…", "...") for c in _ALL])
def test_a_documented_command_runs_as_written(command: str, tmp_path: Path) -> None:
    argv, extra = invocation(command, tmp_path)
    key = (tuple(argv), tuple(sorted(extra.items())))
    if key not in _DONE and not extra and argv[1:2] == ["manage.py"]:
        _manage_batch(tmp_path)
    done = _DONE.get(key) or subprocess.run(argv, cwd=ROOT, env=_fresh_shell(extra), capture_output=True, text=True,
                                            timeout=120)
    _DONE[key] = done
    assert done.returncode == 0, f"{command!r} ran as {argv}: exit {done.returncode}\n{done.stderr[-3000:]}"
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
