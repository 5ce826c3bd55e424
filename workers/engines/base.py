"""The rollout engine interface shared by the vLLM and transformers engines.

Prompts go in as token ids (built with the model's chat template by `prompt_ids`), so both
engines see exactly the same input and the trainer can rebuild it. Each sample's logprobs
are of the model's own distribution (temperature 1, no top-k/top-p), one per response token:
what vLLM returns by default (`logprobs_mode="raw_logprobs"`) and what a plain forward pass
of the same weights gives.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeAlias, runtime_checkable

from kernel.exceptions import InvalidInput
# The pure folder check, not the port: engines run where Django is not set up (a learner
# gang's ranks, the weight-sync protocol's spawned processes).
from kernel.model_dirs import model_dir_missing, model_missing_said

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from kernel.config import SamplingConfig
    from workers.vision import ImagePrompt

# What an engine samples from: a prompt's token ids, or an image-text prompt (its ids with
# the pictures' placeholders expanded, and the pictures).
Prompt: TypeAlias = "Sequence[int] | ImagePrompt"

FinishReason = Literal["stop", "length"]


@dataclass(frozen=True)
class Sample:
    """One completion: response token ids (the end-of-sequence token included when the
    model produced it), one logprob per token, the decoded text and why it ended."""

    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: FinishReason
    # With SamplingSpec.logprobs = k > 0: per token, the k likeliest (token id, logprob).
    top_logprobs: list[list[tuple[int, float]]] | None = None


# A temperature under this samples as greedy (vLLM's own threshold, _SAMPLING_EPS).
GREEDY_BELOW = 1e-5


@dataclass(frozen=True)
class SamplingSpec:
    temperature: float = 1.0
    top_p: float = 1.0
    # -1 or 0: no top-k.
    top_k: int = -1
    max_tokens: int = 64
    stop: tuple[str, ...] = field(default_factory=tuple)
    seed: int | None = None
    # How many alternatives per token to report besides the sampled one (OpenAI's top_logprobs).
    logprobs: int = 0

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError("temperature must be >= 0")
        if self.temperature < GREEDY_BELOW:
            # Logits divided by 1e-300 are inf and the sampler fails on NaN probabilities
            # (the OpenAI endpoint's fuzzing found it); vLLM treats such a temperature as
            # greedy, and so does every engine here.
            object.__setattr__(self, "temperature", 0.0)
        if not 0 < self.top_p <= 1:
            raise ValueError("top_p must be in (0, 1]")
        if self.top_k < -1:
            raise ValueError("top_k must be -1, 0 or positive")
        if self.max_tokens < 1:
            raise ValueError("max_tokens must be at least 1")
        if not 0 <= self.logprobs <= 20:
            raise ValueError("logprobs must be from 0 to 20")
        object.__setattr__(self, "stop", tuple(self.stop))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @classmethod
    def from_config(cls, sampling: SamplingConfig) -> SamplingSpec:
        """From a run config's `sampling` section (its `eval.sampling` too)."""
        return cls(**{k: v for k, v in sampling.model_dump().items() if k in cls.__dataclass_fields__})

    def with_overrides(self, overrides: Mapping[str, Any] | None) -> SamplingSpec:
        """A copy with the given fields changed; unknown names raise ValueError naming them."""
        if not overrides:
            return self
        unknown = set(overrides) - set(self.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown sampling parameters: {', '.join(sorted(unknown))}")
        return replace(self, **dict(overrides))

    def as_dict(self) -> dict[str, object]:
        data = asdict(self)
        data["stop"] = list(self.stop)
        return data


@runtime_checkable
class RolloutEngine(Protocol):
    """A resident model that samples completions. Not thread-safe across `load` and
    `generate`: callers load a new version between batches, never during one."""

    backend: str
    tokenizer: PreTrainedTokenizerBase

    @property
    def version(self) -> int | None: ...

    def generate(self, prompts: Sequence[Prompt], *, n: int, sampling: SamplingSpec) -> list[list[Sample]]: ...

    def load(self, *, version: int, path: str) -> None: ...

    def close(self) -> None:
        """Stop what the engine runs beside this process (vLLM's engine core and workers) now:
        a worker's shutdown calls it (engine_cache_close). An in-process engine has nothing to stop."""
        ...


def prompt_ids(tokenizer: PreTrainedTokenizerBase, *, text: str | None = None,
               messages: Sequence[Mapping[str, str]] | None = None) -> list[int]:
    """Token ids of a prompt: chat messages (or text as one user message) through the
    tokenizer's chat template with the assistant turn opened; plain text when the tokenizer
    has no template."""
    if (text is None) == (messages is None):
        raise ValueError("give exactly one of text or messages")
    if getattr(tokenizer, "chat_template", None):
        chat = list(messages) if messages is not None else [{"role": "user", "content": text}]
        rendered = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
        return list(tokenizer(rendered, add_special_tokens=False)["input_ids"])
    if messages is not None:
        text = "\n".join(m["content"] for m in messages)
    return list(tokenizer(text)["input_ids"])


def tokenizer_folder_check(path: str) -> None:
    """A local folder to load a tokenizer from must hold one: without its files transformers
    either asks to install sentencepiece or tiktoken or, for some configs, builds an empty
    tokenizer of one token without a word. InvalidInput names what is missing instead."""
    folder = Path(path).expanduser()
    if folder.is_dir() and not (folder / "adapter_config.json").is_file() and "tokenizer" in model_dir_missing(path=folder):
        raise InvalidInput(model_missing_said(name=path, missing=["tokenizer"]), field="model")


def tokenizer_from_pretrained(path: str) -> PreTrainedTokenizerBase:
    """`AutoTokenizer.from_pretrained(path)`, after checking that a local folder holds one."""
    from transformers import AutoTokenizer

    tokenizer_folder_check(path)
    return AutoTokenizer.from_pretrained(path)


def tokenizer_load(path: str) -> PreTrainedTokenizerBase:
    tokenizer = tokenizer_from_pretrained(path)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def trim_at_stop(text: str, stop: Sequence[str]) -> tuple[str, bool]:
    """Cut text before the first stop string, as vLLM does; (text, whether one was found)."""
    cut = min((i for i in (text.find(s) for s in stop if s) if i >= 0), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)
