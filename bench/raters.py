"""Scripted raters for bench/steering: each a function (prompt, completion) -> a rating 1..5,
the completion as a person reads it on the annotation page.

`correct` is what a verifier knows (the `<answer>` is right). The others are preferences of
style no reward term of the run knows: `concise` (nothing beside the answer), `working`
(the working shown before the answer), `in_words` (the number written in words). Any other
rater is a function of the same shape in any file: `--rater path/to/file.py:function` or
`--rater package.module:function` (`rater_load`).
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
from collections.abc import Callable
from pathlib import Path

Rating = Callable[[str, str], int]

PROBLEM = re.compile(r"What is (-?\d+) ([+-]) (-?\d+)\?")
ANSWER = re.compile(r"<answer>\s*(-?\d+)\s*</answer>")
ANSWER_SPAN = re.compile(r"<answer>.*?</answer>", re.DOTALL)


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


def concise(prompt: str, completion: str) -> int:
    """5 for the bare answer; one point less per few words beside it, down to 1."""
    rest = ANSWER_SPAN.sub(" ", completion)
    words = len(re.findall(r"\w+", rest))
    return max(1, 5 - (words + 2) // 3)


def working(prompt: str, completion: str) -> int:
    """5 when a calculation (an operation or an equals sign between numbers) comes before the
    answer, 3 when it comes after or words do, 1 for the answer alone."""
    span = ANSWER_SPAN.search(completion)
    before = completion[:span.start()] if span else completion
    after = completion[span.end():] if span else ""
    calculation = re.compile(r"-?\d+\s*[-+*/=]\s*-?\d+")
    if calculation.search(before):
        return 5
    if calculation.search(after) or len(re.findall(r"[A-Za-z]{2,}", before)) >= 2:
        return 3
    return 1


_ONES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve",
         "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen"]
_TENS = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]


def number_words(n: int) -> str:
    """An integer in English words, below a thousand ("minus" before a negative one)."""
    if n < 0:
        return "minus " + number_words(-n)
    if n < 20:
        return _ONES[n]
    if n < 100:
        return _TENS[n // 10] + ("-" + _ONES[n % 10] if n % 10 else "")
    if n < 1000:
        rest = n % 100
        return _ONES[n // 100] + " hundred" + (" and " + number_words(rest) if rest else "")
    return str(n)


def in_words(prompt: str, completion: str) -> int:
    """5 when the answer's number is written in words in the completion, 3 when some number
    is written in words, 1 otherwise (right or wrong is not this rater's business)."""
    text = completion.lower().replace("-", " ")
    answer = ANSWER.search(completion)
    if answer is not None and number_words(int(answer.group(1))).replace("-", " ") in text:
        return 5
    if re.search(r"\b(" + "|".join(_ONES[1:] + _TENS[2:]) + r")\b", text):
        return 3
    return 1


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

    def rating(prompt: str, completion: str) -> int:
        value = rate(prompt, completion)
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 5:
            raise ValueError(f"rater {name} answered {value!r}; a rating is an integer 1..5")
        return value

    return rating


STYLE_RATERS = {"concise": concise, "working": working, "in_words": in_words}
