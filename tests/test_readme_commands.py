"""Every command the README and the docs site (docs/, bench/README.md) show runs as written, from the checkout's root as a person who
just cloned it would type it (`python` being the venv's). A command that would start a
server, train or build a model is asked for its `--help`; a make target is dry-run (`make -n`);
the rest run whole. New commands in the README are picked up by the reader below, so a
documented command that breaks fails here."""

from __future__ import annotations

import itertools
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
# What each distinct invocation did: the pages show many commands that this test turns into
# the same one (`rft create …` with other options is `rft create --help` each time; 52
# commands, 39 invocations), run once and judged for each.
_DONE: dict[tuple[tuple[str, ...], tuple[tuple[str, str], ...]], subprocess.CompletedProcess[str]] = {}


@pytest.mark.parametrize("command", _ALL, ids=[c.replace("…", "...") for c in _ALL])
def test_a_documented_command_runs_as_written(command: str, tmp_path: Path) -> None:
    argv, extra = invocation(command, tmp_path)
    env = {**os.environ, **extra}
    # A fresh shell: nothing put on the path by pytest, so an example that cannot find the
    # project fails here as it would for a person.
    env.pop("PYTHONPATH", None)
    env.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)  # pytest-django's, which `check --deploy` rightly refuses
    key = (tuple(argv), tuple(sorted(extra.items())))
    done = _DONE.get(key) or subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    _DONE[key] = done
    assert done.returncode == 0, f"{command!r} ran as {argv}: exit {done.returncode}\n{done.stderr[-3000:]}"
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
