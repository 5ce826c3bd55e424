"""Math rewards: answer equivalence with math-verify, and the answer-tag format.

math-verify parses LaTeX and plain expressions into sympy and compares them; when it
cannot parse one side (prose, garbage, a unit it does not know) we fall back to a numeric
comparison and then to a normalised exact comparison, so a plain "19" is never lost to a
parser quirk.
"""

from __future__ import annotations

import functools
import logging
import math
import re
import threading

from apps.rewards.answers import CLOSE, MAX_ANSWER_CHARS, OPEN, answer_extract, answer_tags
from kernel.rewards import RewardResult, booleans_check, domain_register, reference_text, register

log = logging.getLogger(__name__)


def _latex_wrapped(text: str) -> str:
    # Inside $…$ math-verify reads the whole expression; bare, it may pick the first number.
    if "$" in text or "\\boxed" in text or "\\(" in text or "\\[" in text:
        return text
    return f"${text}$"


def _mv_parse(text: str, timeout: int | None) -> list[object]:
    from math_verify import parse

    parsed = parse(_latex_wrapped(text), parsing_timeout=timeout)
    if not _has_expression(parsed) and _latex_wrapped(text) != text:
        parsed = parse(text, parsing_timeout=timeout)
    # A list of only strings is math-verify echoing text it could not read: not a parse.
    return parsed if _has_expression(parsed) else []


@functools.lru_cache(maxsize=4096)
def _mv_parse_gold(text: str, timeout: int | None) -> tuple[object, ...]:
    # A taskset's references repeat for every sample of a group and every epoch: parse once.
    return tuple(_mv_parse(text, timeout))


# A plain integer (optional sign, digits only): equal exactly when the integers are, which is
# what math-verify concludes too, at a thousandth of its cost (a sympy parse per side, ~5 ms).
_INTEGER = re.compile(r"[+-]?\d{1,100}")


def _has_expression(parsed: list[object]) -> bool:
    return any(not isinstance(p, str) for p in parsed)


def _number(text: str) -> float | None:
    cleaned = text.strip().strip("$").replace(",", "").replace(" ", "")
    cleaned = cleaned.removesuffix(".")
    try:
        value = float(cleaned)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def answers_equivalent(*, gold: str, answer: str, timeout: int = 5) -> tuple[bool, str]:
    """Whether `answer` equals `gold` mathematically; also says which check decided."""
    gold, answer = gold.strip(), answer.strip()
    if not answer or not gold:
        return False, "empty"
    if _INTEGER.fullmatch(gold) and _INTEGER.fullmatch(answer):
        return int(gold) == int(answer), "integer"
    # math-verify's timeouts use SIGALRM, which only the main thread may set.
    mv_timeout: int | None = timeout if threading.current_thread() is threading.main_thread() else None
    try:
        gold_parsed = list(_mv_parse_gold(gold, mv_timeout))
        answer_parsed = _mv_parse(answer, mv_timeout)
    except Exception:
        log.debug("math-verify failed on %r / %r", gold[:80], answer[:80], exc_info=True)
        gold_parsed, answer_parsed = [], []
    if gold_parsed and answer_parsed:
        from math_verify import verify

        try:
            if verify(gold_parsed, answer_parsed, timeout_seconds=mv_timeout):
                return True, "math_verify"
        except Exception:
            log.debug("math-verify verify failed", exc_info=True)
        # Both parsed and differ: trust the parser unless plain numbers say otherwise.
    g, a = _number(gold), _number(answer)
    if g is not None and a is not None:
        return math.isclose(g, a, rel_tol=1e-6, abs_tol=1e-9), "numeric"
    if gold_parsed and answer_parsed:
        return False, "math_verify"
    return " ".join(gold.split()).casefold() == " ".join(answer.split()).casefold(), "exact"


@register("math_accuracy", check=booleans_check("math_accuracy", "require_tags"),
          description="1 when the <answer> (else the completion's final expression) equals the reference")
def math_accuracy(completion: str, task: object, *, require_tags: bool = False, **params: object) -> RewardResult:
    answer = answer_extract(completion)
    if answer is None:
        if require_tags:
            return RewardResult(0.0, {"math_accuracy": 0.0})
        # Untagged: math-verify looks for a \boxed{} or the last expression, on the tail only.
        answer = completion[-MAX_ANSWER_CHARS:]
    if len(answer) > MAX_ANSWER_CHARS:
        return RewardResult(0.0, {"math_accuracy": 0.0})
    ok, _how = answers_equivalent(gold=reference_text(task), answer=answer)
    return RewardResult(float(ok), {"math_accuracy": float(ok)})


@register("math_format", check=booleans_check("math_format", "strict"),
          description="1 for exactly one non-empty <answer>…</answer>; strict: and nothing after it")
def math_format(completion: str, task: object, *, strict: bool = False, **params: object) -> RewardResult:
    tags = answer_tags(completion)
    ok = (
        len(tags) == 1
        and completion.count(OPEN) == 1
        and completion.count(CLOSE) == 1
        and 0 < len(tags[0].strip()) <= MAX_ANSWER_CHARS
    )
    if ok and strict:
        ok = completion.rstrip().endswith(CLOSE)
    return RewardResult(float(ok), {"math_format": float(ok)})


# Tasks of this domain are scored by these terms when a run names none of its own.
# Its verifier is the answer's equivalence with the reference, whatever the form: accuracy
# counts right answers, and the format share counts well-formed ones, apart.
domain_register("math", terms={"math_accuracy": 1.0, "math_format": 0.1}, verifier="math_accuracy",
                format="math_format")
