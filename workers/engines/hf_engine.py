"""The transformers rollout engine: the embedded default and the fallback where vLLM is absent."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, cast

from workers.weights.adapters import (
    ADAPTER_CONFIG,
    adapter_base,
    adapter_load,
    adapter_weights_apply,
    adapter_weights_load,
    is_adapter_dir,
    is_adapter_model,
)
from workers.engines.base import FinishReason, Prompt, Sample, SamplingSpec, tokenizer_load, trim_at_stop
from workers.vision import ImagePrompt, is_vision_model, pixel_inputs, processor_load

if TYPE_CHECKING:
    import torch
    from PIL.Image import Image
    from transformers import ProcessorMixin


class HFEngine:
    """Holds one model; `load` swaps in a version's weights. A LoRA version (a peft adapter
    directory) goes onto the base already held: the first one wraps it, later ones only
    replace the adapter's tensors."""

    backend = "transformers"

    def __init__(
        self, *, path: str, version: int = 0, device: str | None = None, batch_size: int = 128, dtype: str = "auto"
    ) -> None:
        import torch

        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.batch_size = batch_size
        if dtype == "auto":
            self.dtype = torch.float32 if self.device == "cpu" else torch.bfloat16
        else:
            self.dtype = getattr(torch, dtype)
        self._lock = threading.Lock()
        self._version: int | None = None
        self.path = ""
        # The full-weight directory the held model (or an adapter's base) came from.
        self.base_path = ""
        self.tokenizer = tokenizer_load(path)
        # A vision-language model's processor turns pictures into pixel tensors (workers/vision.py).
        self.processor: ProcessorMixin | None = processor_load(path) if is_vision_model(path) else None
        # None until the first `load` below; a torch.nn.Module from then on.
        self.model: Any = None
        self.load(version=version, path=path)

    def close(self) -> None:
        """Nothing runs beside this process: the model goes with it."""

    @property
    def version(self) -> int | None:
        return self._version

    def load(self, *, version: int, path: str) -> None:
        with self._lock:
            if is_adapter_dir(path):
                self._adapter_load(path)
            else:
                self.model, self.base_path = self._full_load(path), path
            if self.model.training:  # a walk over every module: only when needed
                self.model.eval()
            self.path, self._version = path, version
            # The context the model was built for: the OpenAI endpoint refuses longer prompts.
            config = self.model.config
            self.max_model_len = int(getattr(config, "max_position_embeddings", 0)
                                     or getattr(config.get_text_config(), "max_position_embeddings", 0) or 0)

    def load_tensors(self, *, version: int, path: str, tensors: dict[str, torch.Tensor]) -> bool:
        """Take a version's tensors as broadcast by the trainer (no checkpoint read): an
        adapter's onto the adapter held for the same base, full weights onto the model held.
        False when they do not fit what is held (the caller loads the checkpoint instead)."""
        from peft import set_peft_model_state_dict

        with self._lock:
            if is_adapter_dir(path):
                same_base = os.path.realpath(adapter_base(path)) == os.path.realpath(self.base_path)
                if not (is_adapter_model(self.model) and same_base):
                    return False
                if adapter_weights_apply(model=self.model, tensors=tensors):
                    self.path, self._version = path, version
                    return True
                held = {k for k in self.model.state_dict() if "lora_" in k}
                result = set_peft_model_state_dict(self.model, tensors)
                if getattr(result, "unexpected_keys", None) or not held:
                    return False
            else:
                if is_adapter_model(self.model) or set(tensors) != set(self.model.state_dict()):
                    return False
                self.model.load_state_dict(tensors, strict=True)
            self.model.eval()
            self.path, self._version = path, version
            return True

    def _full_load(self, path: str) -> torch.nn.Module:
        from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

        auto = AutoModelForImageTextToText if is_vision_model(path) else AutoModelForCausalLM
        return auto.from_pretrained(path, dtype=self.dtype).to(self.device)

    def _adapter_load(self, path: str) -> None:
        import json
        from pathlib import Path

        base = adapter_base(path)
        same_base = os.path.realpath(base) == os.path.realpath(self.base_path) if self.base_path else False
        if is_adapter_model(self.model) and same_base:
            held = self.model.peft_config["default"]
            wanted = json.loads((Path(path) / ADAPTER_CONFIG).read_text())
            if held.r == wanted.get("r") and sorted(held.target_modules) == sorted(wanted.get("target_modules") or []):
                adapter_weights_load(model=self.model, path=path)
                return
        if not same_base or is_adapter_model(self.model):
            self.model, self.base_path = self._full_load(base), base
        self.model = adapter_load(base_model=self.model, path=path, trainable=False).to(self.device)

    def _eos_ids(self) -> set[int]:
        ids = self.model.generation_config.eos_token_id
        ids = ids if isinstance(ids, list) else [ids]
        return {i for i in ids + [self.tokenizer.eos_token_id] if i is not None}

    # `generate(on_tokens=…)` hands over each decoding step's tokens as they are sampled.
    streams_tokens = True

    def generate(self, prompts: Sequence[Prompt], *, n: int, sampling: SamplingSpec,
                 on_tokens: Callable[[list[int]], None] | None = None) -> list[list[Sample]]:
        """`prompts`: token ids, or `workers.vision.ImagePrompt`s (expanded ids and pictures).

        `on_tokens`: called after every decoding step with one token id per row (row
        i·n + j is choice j of prompt i; a row that has finished gets the pad token), while
        the generation goes on: what streaming sends token by token."""
        if n < 1:
            raise ValueError("n must be at least 1")
        out: dict[int, list[Sample]] = {}
        # Prompts with pictures go in batches of their own (pixel tensors for every row).
        pictured = [i for i, p in enumerate(prompts) if isinstance(p, ImagePrompt)]
        plain = [i for i, p in enumerate(prompts) if not isinstance(p, ImagePrompt)]
        if pictured and self.processor is None:
            raise ValueError(f"{self.path} is not a vision-language model; a prompt with images needs one")
        with self._lock:
            if sampling.seed is not None:
                import torch

                # Once per call, not per chunk: chunks seeded alike would draw the same
                # random numbers, and their samples would be correlated.
                torch.manual_seed(sampling.seed)
            per_call = max(1, self.batch_size // n)
            if on_tokens is not None and len(prompts) > per_call:
                raise ValueError(f"streaming takes at most {per_call} prompts at a time")
            for members, with_images in ((plain, False), (pictured, True)):
                for start in range(0, len(members), per_call):
                    chunk = members[start : start + per_call]
                    images = [cast(ImagePrompt, prompts[i]).images for i in chunk] if with_images else None
                    for i, samples in zip(chunk, self._generate_chunk([prompts[i] for i in chunk], n=n, sampling=sampling,
                                                                      images=images, on_tokens=on_tokens)):
                        out[i] = samples
        return [out[i] for i in range(len(prompts))]

    def _generate_chunk(
        self, prompts: Sequence[Prompt], *, n: int, sampling: SamplingSpec, images: Sequence[Sequence[Image]] | None = None,
        on_tokens: Callable[[list[int]], None] | None = None,
    ) -> list[list[Sample]]:
        import torch

        pad = self.tokenizer.pad_token_id
        # generate refuses num_return_sequences > 1 when greedy: generate once and hand the
        # answer out n times (repeated rows of one batch gave logprobs that differed in the 7th
        # digit, and cost a row each for one answer).
        copies = n if sampling.greedy else 1
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[pad] * (width - len(p)) + list(p) for p in prompts], device=self.device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=self.device)
        kwargs = self._generate_kwargs(n=n, copies=copies, sampling=sampling)
        if images is not None:
            kwargs.update(self._pixels(images))
        if on_tokens is not None:
            kwargs["streamer"] = _StepStreamer(_copied(on_tokens, copies))
        with torch.inference_mode():
            result = self.model.generate(input_ids=ids, attention_mask=mask, **kwargs)
        rows = _GeneratedRows.of(result, width=width, top_k=sampling.logprobs)
        samples: list[Sample] = []
        for row in range(len(rows.tokens)):
            sample = self._row_sample(rows, row, sampling=sampling)
            samples += [replace(sample, token_ids=list(sample.token_ids), logprobs=list(sample.logprobs),
                                top_logprobs=None if sample.top_logprobs is None else list(sample.top_logprobs))
                        for _ in range(copies)]
        return [samples[i * n : (i + 1) * n] for i in range(len(prompts))]

    def _generate_kwargs(self, *, n: int, copies: int, sampling: SamplingSpec) -> dict[str, object]:
        """generate's arguments for `sampling`, pictures and streaming aside."""
        pad = self.tokenizer.pad_token_id
        kwargs: dict[str, object] = {
            "max_new_tokens": sampling.max_tokens,
            "num_return_sequences": n // copies,
            "return_dict_in_generate": True,
            # Raw logits: logprobs of the model's own distribution, as vLLM reports them.
            "output_logits": True,
            "pad_token_id": pad,
            "eos_token_id": sorted(self._eos_ids()),
        }
        if sampling.greedy:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        else:
            kwargs.update(
                do_sample=True,
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                # 0, not None: None means the generation config's default (50), which would
                # sample from a truncated distribution while the logprobs are the full one's.
                top_k=sampling.top_k if sampling.top_k > 0 else 0,
            )
        if sampling.stop:
            kwargs.update(stop_strings=list(sampling.stop), tokenizer=self.tokenizer)
        return kwargs

    def _pixels(self, images: Sequence[Sequence[Image]]) -> dict[str, torch.Tensor]:
        """The pictures' tensors on the engine's device, one per prompt row: generate expands
        them itself for num_return_sequences."""
        pixels = {k: v.to(self.device) for k, v in pixel_inputs(self.processor, list(images)).items()}
        if "pixel_values" in pixels:
            pixels["pixel_values"] = pixels["pixel_values"].to(self.dtype)
        return pixels

    def _row_sample(self, rows: _GeneratedRows, row: int, *, sampling: SamplingSpec) -> Sample:
        """One generated row as a Sample: cut at its end (an EOS, or the pad generate puts
        after a stop string), decoded, trimmed at a stop string."""
        pad = self.tokenizer.pad_token_id
        eos = self._eos_ids()
        tokens: list[int] = []
        logprobs: list[float] = []
        top: list[list[tuple[int, float]]] | None = [] if sampling.logprobs else None
        finish: FinishReason = "length"
        for t, token in enumerate(rows.tokens[row]):
            if token == pad and token not in eos:
                # generate pads a row that a stop string ended while others go on.
                finish = "stop"
                break
            tokens.append(token)
            logprobs.append(rows.logprobs[row][t])
            if top is not None:
                top.append(list(zip(rows.top_indices[row][t], rows.top_values[row][t])))
            if token in eos:
                finish = "stop"
                break
        text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        text, stopped = trim_at_stop(text, sampling.stop)
        return Sample(token_ids=tokens, logprobs=logprobs, text=text, finish_reason="stop" if stopped else finish,
                      top_logprobs=top)


def _copied(on_tokens: Callable[[list[int]], None], copies: int) -> Callable[[list[int]], None]:
    """A streaming callback for a greedy batch generated once and handed out `copies` times."""
    if copies == 1:
        return on_tokens

    def each(tokens: list[int]) -> None:
        on_tokens([t for t in tokens for _ in range(copies)])

    return each


@dataclass(frozen=True)
class _GeneratedRows:
    """generate's result as plain lists, per row: its new tokens, their logprobs, and per
    token the k likeliest logprobs and their token ids (empty unless asked for)."""

    tokens: list[list[int]]
    logprobs: list[list[float]]
    top_values: list[list[list[float]]]
    top_indices: list[list[list[int]]]

    @classmethod
    def of(cls, result: Any, *, width: int, top_k: int | None) -> _GeneratedRows:
        import torch

        generated = result.sequences[:, width:]
        steps = len(result.logits)
        logps = torch.stack([torch.log_softmax(s.float(), dim=-1) for s in result.logits], dim=1) if steps else None
        # Whole-batch tensor ops, then plain lists: element-wise tensor indexing per token
        # cost as much Python time as a tenth of the generation on a small model.
        rows_logps: list[list[float]] = (
            logps.gather(-1, generated[:, :steps].unsqueeze(-1)).squeeze(-1).tolist() if logps is not None else []
        )
        top_values: list[list[list[float]]] = []
        top_indices: list[list[list[int]]] = []
        if top_k and logps is not None:
            values, indices = torch.topk(logps, top_k, dim=-1)
            top_values, top_indices = values.tolist(), indices.tolist()
        return cls(tokens=generated.tolist(), logprobs=rows_logps, top_values=top_values, top_indices=top_indices)


class _StepStreamer:
    """transformers' streamer protocol (`put` per step, `end`) for every row at once: its own
    streamers (TextIteratorStreamer) take one row only. The first `put` is the prompt."""

    def __init__(self, on_tokens: Callable[[list[int]], None]) -> None:
        self.on_tokens = on_tokens
        self.prompt_seen = False

    def put(self, value: torch.Tensor) -> None:
        if not self.prompt_seen:
            self.prompt_seen = True
            return
        self.on_tokens([int(t) for t in value.reshape(-1).tolist()])

    def end(self) -> None:
        pass
