"""A completion's log-likelihood features and the token arithmetic every reward-model kind
that reads the base shares: the answer span's token range (`answer_span`), the fitting of a
(prompt, completion) into `max_length` (`truncated`) and the statistics of the completion
tokens' log-probabilities (`features_of`, named by FEATURES).

Plain Python, importing nothing of rftweb, torch or transformers: an exported `likelihood`
version carries this file beside workers/reward/likelihood_hf.py (which imports it relatively,
so transformers copies both), and computes its features with the same functions as the
kinds that train (workers/reward/kinds/base_model.py, mlp.py, workers/reward/likelihood.py),
so the two sides cannot drift apart.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

FEATURES = ("sum", "mean", "min", "span_sum", "span_mean", "has_span", "tokens")


def answer_span(text: str, offsets: Sequence[tuple[int, int]] | None, pattern: re.Pattern[str] | None) -> tuple[int, int] | None:
    """The [start, end) token range of the last match of `pattern` (its first group where it
    has one) in `text`, whose tokens cover the characters `offsets` give; None without one."""
    if pattern is None or offsets is None:
        return None
    match = None
    for match in pattern.finditer(text):
        pass
    if match is None:
        return None
    lo, hi = match.span(1) if match.groups() else match.span()
    inside = [i for i, (a, b) in enumerate(offsets) if a < hi and b > lo]
    return (inside[0], inside[-1] + 1) if inside else None


def truncated(prompt: list[int], completion: list[int], span: tuple[int, int] | None,
              max_length: int) -> tuple[list[int], list[int], tuple[int, int] | None]:
    """Fit prompt + completion into max_length: the completion keeps its head, the prompt its tail."""
    completion = completion[:max_length - 1]
    if len(prompt) + len(completion) > max_length:
        prompt = prompt[-(max_length - len(completion)):]
    if span is not None and span[0] >= len(completion):
        span = None
    return prompt, completion, span


def features_of(lp: Sequence[float], span: tuple[int, int] | None) -> list[float]:
    """FEATURES from the completion tokens' log-probabilities and the answer span."""
    lp = list(lp) or [0.0]
    s = [lp[i] for i in range(span[0], min(span[1], len(lp)))] if span else []
    return [sum(lp), sum(lp) / len(lp), min(lp), sum(s), sum(s) / len(s) if s else 0.0, 1.0 if s else 0.0,
            float(len(lp))]
