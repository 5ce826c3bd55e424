"""A `likelihood` reward model as a Hugging Face sequence classifier, so an exported version
loads where any reward model does:

    model = AutoModelForSequenceClassification.from_pretrained(path, trust_remote_code=True)
    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=True)
    ids = tokenizer.apply_chat_template([{"role": "user", ...}, {"role": "assistant", ...}])
    score = model(input_ids=torch.tensor([ids])).logits[0, 0]

The input is what rftweb's trainer sees: the prompt through the chat template with the
assistant turn opened, then the completion's tokens and eos. Where the completion starts is
read from `completion_mask` when given (1 on the completion's tokens), else found after the
last occurrence of the chat template's assistant opening (`response_template`). The logit is
the raw score w · z of workers/reward/likelihood.py; `config.calibration` holds the scale and
offset that put it on the run's [0, 1] reward scale (clamped).

Exported with transformers' `register_for_auto_class`, which copies this file into the
directory with the one it imports relatively (workers/reward/logprob_features.py), so it
imports nothing else of rftweb: workers/reward/likelihood.py computes its features with the
same functions, and the two cannot drift apart.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import SequenceClassifierOutput

# Relative, so that transformers copies logprob_features.py beside this file in an export.
from .logprob_features import FEATURES, answer_span, features_of, truncated

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def completion_logprobs(model: PreTrainedModel, rows: Sequence[tuple[list[int], int]], pad: int) -> list[list[float]]:
    """Per row (ids, prompt length): the log-probabilities of the tokens after the prompt."""
    width = max(len(ids) for ids, _ in rows)
    input_ids = torch.tensor([ids + [pad] * (width - len(ids)) for ids, _ in rows], device=model.device)
    mask = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids, _ in rows], device=model.device)
    with torch.inference_mode():
        logits = model(input_ids=input_ids, attention_mask=mask).logits.float()
    token_lp = torch.log_softmax(logits[:, :-1], -1).gather(2, input_ids[:, 1:, None])[..., 0].cpu()
    # Position t of token_lp is the log-probability of token t + 1.
    return [token_lp[row, max(cut, 1) - 1:len(ids) - 1].tolist() for row, (ids, cut) in enumerate(rows)]


class LikelihoodRewardConfig(PretrainedConfig):  # type: ignore[misc]  # transformers is skipped by mypy (pyproject): Any
    model_type = "rftweb_likelihood_rm"

    def __init__(self, lm_config: dict[str, object] | None = None, mean: list[float] | None = None,
                 std: list[float] | None = None, weights: list[float] | None = None,
                 answer_pattern: str | None = None, max_length: int = 512,
                 response_template: list[int] | None = None, calibration: dict[str, float] | None = None,
                 **kwargs: object) -> None:
        kwargs.setdefault("num_labels", 1)
        super().__init__(**kwargs)
        self.lm_config = lm_config or {}
        self.mean = mean or [0.0] * len(FEATURES)
        self.std = std or [1.0] * len(FEATURES)
        self.weights = weights or [0.0] * len(FEATURES)
        self.answer_pattern = answer_pattern
        self.max_length = max_length
        self.response_template = response_template or []
        self.calibration = calibration or {"scale": 1.0, "offset": 0.5}


class LikelihoodRewardModel(PreTrainedModel):  # type: ignore[misc]  # transformers is skipped by mypy (pyproject): Any
    """The base causal LM (`lm`) and the fitted head in the config; `logits` is (batch, 1)."""

    config_class = LikelihoodRewardConfig
    base_model_prefix = "lm"

    def __init__(self, config: LikelihoodRewardConfig) -> None:
        super().__init__(config)
        self.lm = AutoModelForCausalLM.from_config(AutoConfig.for_model(**config.lm_config))
        self._tokenizer: PreTrainedTokenizerBase | None = None
        self.post_init()

    def _tokenizer_get(self) -> PreTrainedTokenizerBase:
        # The tokenizer saved beside the weights: the answer span is found in the completion's text.
        if self._tokenizer is None:
            self._tokenizer = AutoTokenizer.from_pretrained(self.config._name_or_path, trust_remote_code=True)
        return self._tokenizer

    def _cut(self, ids: list[int], completion: list[int] | None) -> int:
        if completion is not None:
            return completion.index(1) if 1 in completion else len(ids)
        template = list(self.config.response_template)
        for start in range(len(ids) - len(template), -1, -1):
            if template and ids[start:start + len(template)] == template:
                return start + len(template)
        raise ValueError("no assistant turn opening (config.response_template) in the input: pass completion_mask "
                         "(1 on the completion's tokens)")

    def _span(self, completion: list[int]) -> tuple[int, int] | None:
        if not self.config.answer_pattern:
            return None
        tokenizer = self._tokenizer_get()
        body = completion[:-1] if completion and completion[-1] == tokenizer.eos_token_id else completion
        text = tokenizer.decode(body)
        try:
            enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
            offsets = enc["offset_mapping"] if list(enc["input_ids"]) == body else None
        except (NotImplementedError, ValueError, KeyError):
            offsets = None
        if offsets is None:  # the text does not tokenise back to these ids: offsets by decoding
            offsets, end = [], 0
            for i in range(len(body)):
                now = len(tokenizer.decode(body[:i + 1]))
                offsets.append((end, now))
                end = now
        return answer_span(text, offsets, re.compile(self.config.answer_pattern, re.DOTALL))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                completion_mask: torch.Tensor | None = None, **_: object) -> SequenceClassifierOutput:
        cfg = self.config
        rows: list[tuple[list[int], int]] = []
        spans: list[tuple[int, int] | None] = []
        for row in range(input_ids.shape[0]):
            keep = attention_mask[row].bool() if attention_mask is not None else torch.ones_like(input_ids[row], dtype=torch.bool)
            ids = input_ids[row][keep].tolist()
            marks = completion_mask[row][keep].tolist() if completion_mask is not None else None
            cut = self._cut(ids, marks)
            prompt, completion, span = truncated(ids[:cut], ids[cut:], self._span(ids[cut:]), cfg.max_length)
            rows.append((prompt + completion, len(prompt)))
            spans.append(span)
        pad = cfg.lm_config.get("pad_token_id") or 0
        scores = []
        for lp, span in zip(completion_logprobs(self.lm, rows, pad), spans, strict=True):
            f = features_of(lp, span)
            scores.append(sum(w * (x - m) / (s or 1.0) for w, x, m, s in zip(cfg.weights, f, cfg.mean, cfg.std, strict=True)))
        logits = torch.tensor(scores, dtype=torch.float32, device=input_ids.device)[:, None]
        return SequenceClassifierOutput(logits=logits)
