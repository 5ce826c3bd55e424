"""clean: tidy text, and keep truncated or over-long responses out of the loss."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field

from apps.buffer.pipeline.core import Ctx, metadata_set, response_tokens
from kernel.operators import Row
from kernel.operators import Params, register

# C0/C1 control characters except tab and newline (carriage returns are newlines first),
# and U+FFFD: what a NUL in model output becomes when it is written (ExperienceDraft), and
# what a failed decode leaves: never meaningful text.
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ufffd]")
_ODD_SPACE = re.compile(r"[\u00a0\u1680\u2000-\u200a\u202f\u205f\u3000]")
_ODD_NEWLINE = re.compile(r"\r\n?|[\u2028\u2029\x85]")
_TRAILING = re.compile(r"[ \t]+(?=\n|$)")
_BLANK_RUNS = re.compile(r"\n{3,}")
_SPACE_RUNS = re.compile(r"(?<=\S)[ \t]{2,}")


class CleanParams(Params):
    whitespace: bool = True
    control_chars: bool = True
    # Collapse runs of spaces inside lines too. Off by default: indentation is code.
    collapse_spaces: bool = False
    # What to do with a response that stopped at the token limit (finish_reason "length")
    # or exceeds the bounds below: mask it from the loss, filter it out, or leave it.
    truncated: Literal["mask", "filter", "keep"] = "mask"
    max_response_tokens: int | None = Field(None, ge=1)
    max_response_chars: int | None = Field(None, ge=1)


def text_clean(text: str, params: CleanParams) -> tuple[str, bool, bool]:
    """The cleaned text, whether control characters went, whether whitespace changed."""
    had_control = False
    if params.control_chars:
        text = _ODD_NEWLINE.sub("\n", text)
        stripped = _CONTROL.sub("", text)
        had_control = stripped != text
        text = stripped
    before = text
    if params.whitespace:
        text = _ODD_NEWLINE.sub("\n", text)
        text = _ODD_SPACE.sub(" ", text)
        text = _TRAILING.sub("", text)
        text = _BLANK_RUNS.sub("\n\n", text)
        if params.collapse_spaces:
            text = _SPACE_RUNS.sub(" ", text)
        text = text.strip()
    return text, had_control, text != before


def _clean_field(row: Row, name: str, ctx: Ctx, params: CleanParams, changed: set[str]) -> None:
    value = row.get(name)
    if not isinstance(value, str) or not value:
        return
    cleaned, had_control, ws = text_clean(value, params)
    if cleaned != value:
        row[name] = cleaned
        if had_control:
            changed.add("control_chars")
        if ws:
            changed.add("whitespace")


@register("clean", stages=("write", "import", "claim"), params=CleanParams)
def clean(rows: list[Row], ctx: Ctx, params: CleanParams) -> None:
    """Normalise whitespace, drop control characters, mask truncated or over-long responses."""
    for row in rows:
        changed: set[str] = set()
        if ctx.stage == "import":
            _clean_field(row, "prompt", ctx, params, changed)
            messages = row.get("messages")
            if isinstance(messages, list):
                new = []
                for m in messages:
                    m = dict(m)
                    _clean_field(m, "content", ctx, params, changed)
                    new.append(m)
                if new != messages:
                    row["messages"] = new
        else:
            _clean_field(row, "prompt_text", ctx, params, changed)
            _clean_field(row, "response_text", ctx, params, changed)
            _truncation(row, ctx, params)
        for what in changed:
            ctx.count(what)


def _truncation(row: Row, ctx: Ctx, params: CleanParams) -> None:
    if params.truncated == "keep":
        return
    n_tokens = response_tokens(row)
    reason = ""
    if row.get("finish_reason") == "length":
        reason = "truncated"
    elif params.max_response_tokens is not None and n_tokens is not None and n_tokens > params.max_response_tokens or params.max_response_chars is not None and len(str(row.get("response_text") or "")) > params.max_response_chars:
        reason = "over_long"
    if not reason:
        return
    if params.truncated == "filter":
        ctx.drop(row, reason)
        return
    # An all-zero action mask keeps the row (its reward still counts in its group's
    # statistics) while none of its tokens contribute to the loss.
    if n_tokens is not None:
        row["action_mask"] = [0] * n_tokens
    metadata_set(row, loss_masked=reason)
    ctx.count(f"masked_{reason}")
