"""Preferences of style that a run can measure but never reward: the share of held-out
answers a preference likes, charted on the run page as `eval/preference/<name>`.

These are what people teach in rftweb's demo and in `bench/steering` (concise answers, the
working shown before the answer, the number written in words): no reward term knows them,
so a rise in their share on held-out prompts is what people's labels taught. Each is a
rating (prompt, completion) -> 1..5, the answer as a person reads it on the annotation page;
an answer counts toward the share when it gets the top rating (`LIKED`: what the preference
asks for, all of it). The same functions are
the scripted raters of `bench/steering` (bench/raters.py), so the bench's person and the
run's chart agree on what the preference is.

Evaluation only: `eval.preferences` in the run config names them, the evaluator
(workers/explore/evaluation.py) records their shares; nothing lets a reward term read them.
Adding one: a function of this shape and a `preference_register` line (here, or in any module
imported before the config is read).

No Django, no torch: imported by the config (pydantic) and the workers.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from kernel.registry import Registry

Rating = Callable[[str, str], int]

# The rating at which the preference likes an answer: the top one (a rater's 4 for "nearly
# concise" is not the style asked for).
LIKED = 5

ANSWER = re.compile(r"<answer>\s*(-?\d+)\s*</answer>")
ANSWER_SPAN = re.compile(r"<answer>.*?</answer>", re.DOTALL)


@dataclass(frozen=True)
class Preference:
    name: str
    # What a person reads on the run page and in guidelines.
    title: str
    rate: Rating

    def liked(self, prompt: str, completion: str) -> bool:
        return self.rate(prompt, completion) >= LIKED


_REGISTRY: Registry[Preference] = Registry(what="preference", package=__name__, builtin=())


def preference_register(name: str, *, title: str, rate: Rating) -> None:
    _REGISTRY.add(name, Preference(name=name, title=title, rate=rate))


def preference_get(name: str) -> Preference:
    """The preference registered as `name`; ValueError naming the known ones otherwise."""
    return _REGISTRY.get(name)


def preference_names() -> list[str]:
    return _REGISTRY.names()


def preference_shares(names: list[str], samples: list[tuple[str, str]]) -> dict[str, float]:
    """For each preference, the share of (prompt, completion) samples it likes."""
    shares: dict[str, float] = {}
    for name in names:
        preference = preference_get(name)
        liked = sum(1 for prompt, completion in samples if preference.liked(prompt, completion))
        shares[name] = liked / len(samples) if samples else 0.0
    return shares


def concise(prompt: str, completion: str) -> int:
    """5 for the bare answer; one point less per few words beside it, down to 1."""
    rest = ANSWER_SPAN.sub(" ", completion)
    words = len(re.findall(r"\w+", rest))
    return max(1, 5 - (words + 2) // 3)


def working(prompt: str, completion: str) -> int:
    """5 when a calculation (an operation or an equals sign between numbers) comes before the
    answer, 3 when it comes after or words do, 1 for the answer alone, and 1 where there is no
    answer at all: working that never reaches an answer is not what the preference asks for
    (rated 5, it taught the demo run to calculate on and drop the tag: bench/demo_teach)."""
    span = ANSWER_SPAN.search(completion)
    if span is None:
        return 1
    before, after = completion[:span.start()], completion[span.end():]
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


preference_register("concise", title="concise answers (nothing beside the answer)", rate=concise)
preference_register("working", title="the working shown before the answer", rate=working)
preference_register("in_words", title="the number written in words", rate=in_words)
