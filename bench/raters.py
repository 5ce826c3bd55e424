"""Scripted raters for bench/steering: each a function (prompt, completion) -> a rating 1..5,
the completion as a person reads it on the annotation page.

`correct` is what a verifier knows (the `<answer>` is right). The others are preferences of
style no reward term of the run knows: `concise` (nothing beside the answer), `working`
(the working shown before the answer), `in_words` (the number written in words); they live
in apps/runs/preferences.py, where a run's evaluation measures the same preferences' shares. Any other
rater is a function of the same shape in any file: `--rater path/to/file.py:function` or
`--rater package.module:function` (`rater_load`).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import re
import sys
from collections.abc import Callable
from pathlib import Path

from apps.runs.preferences import ANSWER, Rating, concise, in_words, number_words, working

PROBLEM = re.compile(r"What is (-?\d+) ([+-]) (-?\d+)\?")


def _solution(prompt: str) -> int | None:
    m = PROBLEM.search(prompt)
    if m is None:
        return None
    a, op, b = int(m.group(1)), m.group(2), int(m.group(3))
    return a + b if op == "+" else a - b


def correct(prompt: str, completion: str) -> int:
    """5 when the `<answer>` is the problem's solution, 1 otherwise (no answer: 1)."""
    solution, answer = _solution(prompt), ANSWER.search(completion)
    if solution is None or answer is None:
        return 1
    return 5 if int(answer.group(1)) == solution else 1


def rater_load(spec: str) -> Rating:
    """The function named by `MODULE:FUNCTION`: MODULE an importable module (`bench.raters`)
    or a path to a Python file anywhere (`/tmp/mine.py`, `../raters.py`). ValueError saying
    what is wrong otherwise."""
    module_name, sep, function = spec.rpartition(":")
    if not sep or not module_name or not function:
        raise ValueError(f"--rater {spec!r}: expected MODULE:FUNCTION (a module or a .py file, then a function)")
    if module_name.endswith(".py") or "/" in module_name or Path(module_name).is_file():
        path = Path(module_name).expanduser().resolve()
        if not path.is_file():
            raise ValueError(f"--rater {spec!r}: no file {path}")
        unique = f"rft_rater_{abs(hash(str(path)))}"
        loader_spec = importlib.util.spec_from_file_location(unique, path)
        if loader_spec is None or loader_spec.loader is None:
            raise ValueError(f"--rater {spec!r}: {path} cannot be imported")
        module = importlib.util.module_from_spec(loader_spec)
        sys.modules[unique] = module
        loader_spec.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise ValueError(f"--rater {spec!r}: cannot import {module_name}: {exc}") from None
    rate = getattr(module, function, None)
    if not callable(rate):
        raise ValueError(f"--rater {spec!r}: {module_name} has no function {function!r}")
    return checked(rate, name=spec)


def checked(rate: Callable[[str, str], object], *, name: str) -> Rating:
    """`rate`, its every answer checked to be an integer rating 1..5 (a rater that answers
    something else stops the bench naming it, rather than posting a rating the page refuses)."""

    @functools.wraps(rate)  # `__wrapped__`: the function itself, for a caller that asks which it is
    def rating(prompt: str, completion: str) -> int:
        value = rate(prompt, completion)
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 5:
            raise ValueError(f"rater {name} answered {value!r}; a rating is an integer 1..5")
        return value

    return rating


STYLE_RATERS = {"concise": concise, "working": working, "in_words": in_words}
__all__ = ["STYLE_RATERS", "Rating", "checked", "concise", "correct", "in_words", "number_words", "rater_load", "working"]
