"""The run's base model as every reward-model kind reads it: loaded once per worker
(`causal_lm_load`, shared by the kinds), and a (prompt, completion) tokenised as the trainer
tokenises it (the prompt through the chat template, the completion's tokens, then eos; fitted
into `max_length`, with the answer span's token range where `reward_model.answer_pattern`
finds one: `rm_rows`).

The span and the fitting into `max_length` are workers/reward/logprob_features.py's
(`answer_span`, `truncated`): an exported `likelihood` version carries that file and computes
its features with them, so they live there once. torch and transformers are imported when called.
"""

from __future__ import annotations

import functools
import re
import threading
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from workers.engines.base import prompt_ids
from workers.reward.logprob_features import answer_span, truncated

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

# (token ids, prompt length, the answer span's [start, end) within the completion or None).
Row = tuple[list[int], int, "tuple[int, int] | None"]

_load_lock = threading.Lock()


@functools.lru_cache(maxsize=4)
def causal_lm_load(base: str) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """(model, tokenizer) of a causal LM, resident for the worker's life."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with _load_lock:
        device = "cuda" if torch.cuda.is_available() else "cpu"
        tokenizer = AutoTokenizer.from_pretrained(base)
        dtype = torch.float32 if device == "cpu" else "auto"
        model = AutoModelForCausalLM.from_pretrained(base, dtype=dtype).to(device).eval()
        return model, tokenizer


def rm_prompt_ids(tokenizer: PreTrainedTokenizerBase, prompt: str) -> list[int]:
    return list(prompt_ids(tokenizer, text=prompt, messages=None))


def rm_completion_ids(tokenizer: PreTrainedTokenizerBase, completion: str, pattern: re.Pattern[str] | None) -> tuple[list[int], tuple[int, int] | None]:
    """The completion's token ids (eos appended, as the trainer does) and the [start, end)
    token range of the answer span, None when there is none."""
    try:
        enc = tokenizer(completion, add_special_tokens=False, return_offsets_mapping=True)
        offsets = enc["offset_mapping"]
    except (NotImplementedError, ValueError, KeyError):
        enc, offsets = tokenizer(completion, add_special_tokens=False), None
    ids = list(enc["input_ids"])
    span = answer_span(completion, offsets, pattern)
    if tokenizer.eos_token_id is not None:
        ids.append(int(tokenizer.eos_token_id))
    return ids, span


def rm_rows(tokenizer: PreTrainedTokenizerBase, prompts: Sequence[str], completions: Sequence[str], *,
            max_length: int, answer_pattern: str | None = None) -> list[Row]:
    """Each (prompt, completion) as a Row, tokenised as the trainer tokenises it and fitted into
    `max_length` (the completion keeps its head, the prompt its tail); the answer span where
    `answer_pattern` (its first group, the last match) finds one."""
    pattern = re.compile(answer_pattern, re.DOTALL) if answer_pattern else None
    rows: list[Row] = []
    for prompt, completion in zip(prompts, completions, strict=True):
        c, span = rm_completion_ids(tokenizer, completion, pattern)
        p, c, span = truncated(rm_prompt_ids(tokenizer, prompt), c, span, max_length)
        rows.append((p + c, len(p), span))
    return rows


def pad_of(tokenizer: PreTrainedTokenizerBase) -> int:
    """The id a batch is padded with: the tokenizer's pad token, else its eos, else 0."""
    return int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0))


def rm_batch(rows: Sequence[Row], *, pad: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(input ids, attention mask) of `rows`, each padded with `pad` to the longest."""
    import torch

    width = max(len(ids) for ids, _, _ in rows)
    return (torch.tensor([ids + [pad] * (width - len(ids)) for ids, _, _ in rows], device=device),
            torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids, _, _ in rows], device=device))


def rm_chunks(rows: Sequence[Row], *, tokenizer: PreTrainedTokenizerBase, device: torch.device,
              batch_size: int) -> Iterator[tuple[Sequence[Row], torch.Tensor, torch.Tensor]]:
    """`rows` `batch_size` at a time, in order, each chunk with its (input ids, attention mask)
    padded as `rm_batch` pads (the pooled-feature kinds' forward passes)."""
    pad = pad_of(tokenizer)
    for start in range(0, len(rows), batch_size):
        chunk = rows[start:start + batch_size]
        input_ids, mask = rm_batch(chunk, pad=pad, device=device)
        yield chunk, input_ids, mask
