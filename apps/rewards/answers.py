"""Finding the answer in a completion: `<answer>…</answer>` tags, scanned without regex
backtracking so that a multi-megabyte completion costs linear time."""

from __future__ import annotations

OPEN, CLOSE = "<answer>", "</answer>"
# Longer "answers" are not answers; also bounds the work math-verify does on them.
MAX_ANSWER_CHARS = 1000


def answer_tags(completion: str) -> list[str]:
    """The contents of every well-formed <answer>…</answer> pair, in order (no nesting)."""
    found: list[str] = []
    pos = 0
    while True:
        start = completion.find(OPEN, pos)
        if start < 0:
            return found
        end = completion.find(CLOSE, start + len(OPEN))
        if end < 0:
            return found
        inner = completion[start + len(OPEN) : end]
        if OPEN in inner:
            # "<answer> a <answer> b </answer>": the inner pair is the well-formed one.
            start = start + len(OPEN) + inner.rfind(OPEN)
            inner = completion[start + len(OPEN) : end]
        found.append(inner)
        pos = end + len(CLOSE)


def answer_extract(completion: str) -> str | None:
    """The last tagged answer, stripped; None when there is no well-formed tag pair."""
    tags = answer_tags(completion)
    if not tags:
        return None
    return tags[-1].strip()
