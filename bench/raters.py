"""Scripted raters for bench/steering: each a function (prompt, completion) -> a rating 1..5,
the completion as a person reads it on the annotation page.

`correct` is what a verifier knows (the `<answer>` is right). The others are preferences of
style no reward term of the run knows: `concise` (nothing beside the answer), `working`
(the working shown before the answer), `in_words` (the number written in words); they live
in kernel/preferences.py, where a run's evaluation measures the same preferences' shares. Any other
rater is a function of the same shape in any file: `--rater path/to/file.py:function` or
`--rater package.module:function` (`rater_load`).

`preference_draw(seed)` draws a preference from a generated family (below), so the bench can
be read on preferences nobody here wrote: `--raters generated:N` in bench/steering, or one of
them as `--rater generated:SEED`.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import random
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kernel.preferences import ANSWER, Rating, concise, in_words, number_words, working

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
    if spec.startswith("generated:"):
        seed = spec.removeprefix("generated:")
        if not seed.isdigit():
            raise ValueError(f"--rater {spec!r}: expected generated:SEED, SEED a whole number (bench.raters.preference_draw)")
        return preference_draw(int(seed))
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


# ---------------------------------------------------------------- a generated family of preferences
#
# The three raters above are the ones the bench was built with; a figure read on them alone
# says how far the mechanism was tuned to them. `preference_draw(seed)` draws a preference
# from a space wide enough that tuning to one draw does not pay: likes and dislikes of each
# form the demo model writes (workers/models/demo.STYLES: the bare answer, the working first,
# the number in words, a preamble; and no tagged answer at all), of a word or phrase, of a
# length band, combinations of these, combinations with a right answer, a person's own
# partial-credit scale (2s, 3s and 4s, not only 1 and 5) and a noise level. Each part gives a
# credit in [0, 1]; the parts are folded (a weighted mean, or the least of them: a person who
# wants all at once), and the person's scale cuts the fold into 1..5. Deterministic per seed:
# the same seed draws the same preference on every machine (random.Random, no hash()).

FORMS = ("bare", "working", "words", "preamble", "untagged")
FORM_TITLES = {"bare": "the bare answer", "working": "the working shown first", "words": "the number in words",
               "preamble": "a preamble before the answer", "untagged": "no tagged answer"}
_CALCULATION = re.compile(r"-?\d+\s*[-+*/=]\s*-?\d+")
_NUMBER_WORD = re.compile(r"\b(" + "|".join(["minus", "hundred", "zero", "one", "two", "three", "four", "five", "six",
                                             "seven", "eight", "nine", "ten", "eleven", "twelve", "thirteen",
                                             "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen",
                                             "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty",
                                             "ninety"]) + r")\b")
# Words and phrases the demo model writes some of the time (in one form or another), and a few
# it writes rarely: a person may like or dislike any of them.
PHRASES = ("so", "the answer", "answer is", "is", "=", "+", "minus", "hundred", "and", "ty", "teen", "-")


def form_of(completion: str) -> str:
    """Which of the demo model's forms a completion is written in, as a reader sees it (the
    form the words around the `<answer>` tag take; `untagged` when there is no tagged answer)."""
    span = ANSWER.search(completion)
    if span is None:
        return "untagged"
    before = completion[:span.start()]
    rest = before + " " + completion[span.end():]
    if not re.search(r"\w", rest):
        return "bare"
    if _CALCULATION.search(before):
        return "working"
    if _NUMBER_WORD.search(before.lower()):
        return "words"
    return "preamble"


def shown_length(completion: str) -> int:
    """Characters a reader reads: the completion with each `<answer>` tag pair read as its number."""
    return len(re.sub(r"<answer>\s*(-?\d+)\s*</answer>", r"\1", completion).strip())


def _phrase_count(phrase: str, completion: str) -> int:
    text = re.sub(r"</?answer>", " ", completion.lower())
    if phrase.isalpha() and len(phrase) > 3 or phrase in ("so", "is", "and"):
        return len(re.findall(r"\b" + re.escape(phrase) + r"\b", text))
    return text.count(phrase)  # a symbol, a phrase or a piece of a word (`ty`: forty, sixty...)


@dataclass(frozen=True)
class FormPart:
    """Credit by the form a completion takes: the liked (or disliked) form and the partial
    credit the person gives each other form."""

    credit: tuple[tuple[str, float], ...]  # (form, credit) for every form in FORMS
    target: str
    like: bool

    def __call__(self, prompt: str, completion: str) -> float:
        return dict(self.credit)[form_of(completion)]

    def describe(self) -> str:
        others = ", ".join(f"{FORM_TITLES[f]} {c:g}" for f, c in self.credit if f != self.target)
        return f"{'likes' if self.like else 'dislikes'} {FORM_TITLES[self.target]} (others: {others})"


@dataclass(frozen=True)
class PhrasePart:
    """Credit for a word or phrase (or for its absence), `need` occurrences for full credit."""

    phrase: str
    like: bool
    need: int

    def __call__(self, prompt: str, completion: str) -> float:
        present = min(1.0, _phrase_count(self.phrase, completion) / self.need)
        return present if self.like else 1.0 - present

    def describe(self) -> str:
        times = "" if self.need == 1 else f" ({self.need} times for full credit)"
        return f"{'likes' if self.like else 'dislikes'} the text {self.phrase!r}{times}"


@dataclass(frozen=True)
class LengthPart:
    """Credit for a length (characters read) inside [low, high], `falloff` less per character
    outside it; a dislike credits the band's complement the same way round."""

    low: int
    high: int
    falloff: float
    like: bool

    def __call__(self, prompt: str, completion: str) -> float:
        n = shown_length(completion)
        outside = max(0, self.low - n, n - self.high)
        inside = max(0.0, 1.0 - self.falloff * outside)
        return inside if self.like else 1.0 - inside

    def describe(self) -> str:
        return (f"{'likes' if self.like else 'dislikes'} a length of {self.low}-{self.high} characters "
                f"({self.falloff:g} less credit per character outside)")


@dataclass(frozen=True)
class CorrectPart:
    """Credit for the right `<answer>`: all or nothing (`tolerance` 0), or partial credit for
    a near miss (1 - |error| / (tolerance + 1)); no tagged answer: none."""

    tolerance: int

    def __call__(self, prompt: str, completion: str) -> float:
        solution, answer = _solution(prompt), ANSWER.search(completion)
        if solution is None or answer is None:
            return 0.0
        error = abs(int(answer.group(1)) - solution)
        return max(0.0, 1.0 - error / (self.tolerance + 1))

    def describe(self) -> str:
        near = "" if self.tolerance == 0 else f", partial credit within {self.tolerance} of it"
        return f"likes the right answer{near}"


Part = FormPart | PhrasePart | LengthPart | CorrectPart

# A person's scale: the fold in [0, 1] is cut at four points into 1..5.
SCALES = {"even": (0.125, 0.375, 0.625, 0.875), "strict": (0.3, 0.55, 0.75, 0.95),
          "lenient": (0.05, 0.2, 0.4, 0.65), "top-heavy": (0.2, 0.45, 0.7, 0.8)}
NOISES = (0.0, 0.0, 0.05, 0.1, 0.2)
# Completions to check a draw against: each form, right and wrong, of problems of both
# operations, sizes and signs, plus answers without a tag (what the demo model writes).
_PROBES_PROBLEMS = ((12, "+", 7), (38, "-", 4), (3, "-", 9), (95, "+", 8), (60, "-", 0))


def probes() -> list[tuple[str, str]]:
    """(prompt, completion) pairs a drawn rater must rate 1..5 over, every rating given to
    some: the demo model's forms (right, off by one, off by ten), untagged and run-on answers."""
    out: list[tuple[str, str]] = []
    for a, op, b in _PROBES_PROBLEMS:
        prompt = f"What is {a} {op} {b}?"
        right = a + b if op == "+" else a - b
        for value in (right, right + 1, right - 10):
            tag = f"<answer>{value}</answer>"
            out += [(prompt, tag), (prompt, f"{a} {op} {b} = {value}, so {tag}"),
                    (prompt, f"{value} is {number_words(value)}, so {tag}"), (prompt, f"So the answer is {tag}"),
                    (prompt, f"{a} {op} {b} = {value}, so {a} {op} {b} = {value}, so {tag}"),
                    (prompt, f"{tag} {tag}"), (prompt, f"So {value}"), (prompt, f"{value}"),
                    (prompt, f"{a} {op} {b} = {value}, so")]
    return out


def _written(examples: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Of the probes, the four tagged forms the demo model's warm-up writes (STYLES), right or wrong."""
    return [(p, c) for p, c in examples if form_of(c) in FORMS[:4] and c.count("<answer>") == 1 and c.count(" so ") <= 1]


@dataclass(frozen=True)
class GeneratedRater:
    """A drawn preference: a rating (prompt, completion) -> 1..5, noiseless (the bench's page
    rater adds `noise`; the measurement of the preferred share reads the preference itself)."""

    seed: int
    parts: tuple[tuple[Part, int], ...]  # (part, weight)
    fold: str  # "mean" (weighted) or "least" (all at once)
    scale: str
    cuts: tuple[float, float, float, float]
    noise: float

    @property
    def __name__(self) -> str:  # named as a function is, in the bench's lines
        return f"generated:{self.seed}"

    def credit(self, prompt: str, completion: str) -> float:
        values = [(part(prompt, completion), weight) for part, weight in self.parts]
        if self.fold == "least":
            return min(v for v, _ in values)
        return sum(v * w for v, w in values) / sum(w for _, w in values)

    def __call__(self, prompt: str, completion: str) -> int:
        value = self.credit(prompt, completion)
        return 1 + sum(1 for cut in self.cuts if value >= cut - 1e-9)

    @property
    def mixed(self) -> bool:
        """Whether the preference mixes correctness in."""
        return any(isinstance(p, CorrectPart) for p, _ in self.parts)

    @property
    def kinds(self) -> set[str]:
        """The parts of the space this draw covers (`form-like:working`, `phrase-dislike`,
        `combination`, `with-correctness`, `scale:strict`, `noise`...): the family test counts them."""
        out = {f"scale:{self.scale}", f"fold:{self.fold}"}
        for part, _ in self.parts:
            if isinstance(part, FormPart):
                out.add(f"form-{'like' if part.like else 'dislike'}:{part.target}")
                if any(0 < c < 1 for _, c in part.credit):
                    out.add("partial-credit")
            elif isinstance(part, PhrasePart):
                out.add(f"phrase-{'like' if part.like else 'dislike'}")
            elif isinstance(part, LengthPart):
                out.add(f"length-{'like' if part.like else 'dislike'}")
            else:
                out.add("with-correctness")
        if sum(1 for p, _ in self.parts if not isinstance(p, CorrectPart)) >= 2:
            out.add("combination")
        if self.noise > 0:
            out.add("noise")
        return out

    def describe(self) -> str:
        """The preference written out, as a person would say it."""
        joined = (" and " if self.fold == "least" else "; ").join(
            part.describe() + (f" (weight {w})" if len(self.parts) > 1 and self.fold == "mean" else "")
            for part, w in self.parts)
        how = "wants all of: " if self.fold == "least" and len(self.parts) > 1 else ""
        cuts = "/".join(f"{c:g}" for c in self.cuts)
        return (f"generated:{self.seed}: {how}{joined}; scale {self.scale} (credit cut at {cuts} into 1..5); "
                f"noise {self.noise:g}")


def _form_part(rng: random.Random) -> FormPart:
    target = rng.choice(FORMS[:4])  # a form the model writes; `untagged` gets credit, never a like
    like = rng.random() < 0.6
    others = [f for f in FORMS if f != target]
    if rng.random() < 0.5:  # a full ranking of the other forms: a 4, a 3, a 2 and a 1 (or 2..5)
        levels = [0.0, 0.25, 0.5, 0.75] if like else [0.25, 0.5, 0.75, 1.0]
        rng.shuffle(levels)
        given = dict(zip(others, levels, strict=True))
    else:  # partial credit for some, drawn one by one
        choices = (0.0, 0.25, 0.5) if like else (0.5, 0.75, 1.0)
        given = {f: rng.choice(choices) for f in others}
    credit = tuple((f, (1.0 if like else 0.0) if f == target else given[f]) for f in FORMS)
    return FormPart(credit=credit, target=target, like=like)


def _style_part(rng: random.Random) -> Part:
    kind = rng.choices(("form", "phrase", "length"), weights=(4, 2, 2))[0]
    if kind == "form":
        return _form_part(rng)
    if kind == "phrase":
        return PhrasePart(phrase=rng.choice(PHRASES), like=rng.random() < 0.6, need=rng.choice((1, 1, 2)))
    low = rng.choice((0, 4, 10, 16, 20, 26))
    return LengthPart(low=low, high=low + rng.choice((4, 8, 14, 24)), falloff=rng.choice((0.04, 0.1, 0.2)),
                      like=rng.random() < 0.6)


def _draw_once(rng: random.Random, seed: int) -> GeneratedRater:
    count = rng.choices((1, 2, 3), weights=(5, 4, 1))[0]
    parts: list[tuple[Part, int]] = []
    for _ in range(count):
        part = _style_part(rng)
        # One part per form or phrase: a like and a dislike of the same thing say nothing.
        if not any(type(p) is type(part) and getattr(p, "target", getattr(p, "phrase", None)) ==
                   getattr(part, "target", getattr(part, "phrase", None)) for p, _ in parts):
            parts.append((part, rng.choice((1, 1, 2, 3))))
    if rng.random() < 0.3:  # a person who also wants the right answer, as real raters do
        parts.append((CorrectPart(tolerance=rng.choice((0, 0, 2, 5))), rng.choice((1, 1, 2))))
    fold = "least" if len(parts) > 1 and rng.random() < 0.25 else "mean"
    scale = rng.choice(sorted(SCALES))
    jitter = rng.uniform(-0.04, 0.04)
    cuts = tuple(round(min(0.99, max(0.01, c + jitter)), 3) for c in SCALES[scale])
    return GeneratedRater(seed=seed, parts=tuple(parts), fold=fold, scale=scale,
                          cuts=(cuts[0], cuts[1], cuts[2], cuts[3]), noise=rng.choice(NOISES))


def preference_draw(seed: int) -> GeneratedRater:
    """The preference seed `seed` draws. A draw that does not give every rating 1..5 to some
    completion the demo model writes (`probes`: a person who uses the whole scale on what the
    model writes), or that likes none of the model's own four forms or dislikes none, is drawn
    again from the same stream, so the result is a function of the seed."""
    rng = random.Random(f"rftweb-preference-{seed}")
    examples = probes()
    written = _written(examples)
    for _ in range(400):
        rater = _draw_once(rng, seed)
        on_written = {rater(p, c) for p, c in written}
        # ... and tells the model's own forms apart: one of them liked (4-5), one not (1-2), so
        # there is something in what the model writes to amplify (a preference only an answer
        # the model never writes could meet teaches nothing a bench can read).
        if {rater(p, c) for p, c in examples} == {1, 2, 3, 4, 5} and max(on_written) >= 4 and min(on_written) <= 2:
            return rater
    raise RuntimeError(f"preference seed {seed}: no draw covers the scale")  # not seen over 0..9999


def preference_family(count: int, *, start: int = 0) -> list[GeneratedRater]:
    """`count` drawn preferences, seeds start..start+count-1."""
    return [preference_draw(seed) for seed in range(start, start + count)]


STYLE_RATERS = {"concise": concise, "working": working, "in_words": in_words}
__all__ = ["FORMS", "STYLE_RATERS", "GeneratedRater", "Rating", "checked", "concise", "correct", "form_of", "in_words",
           "number_words", "preference_draw", "preference_family", "probes", "rater_load", "working"]
