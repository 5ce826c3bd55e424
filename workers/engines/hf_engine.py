"""The transformers rollout engine: the embedded default and the fallback where vLLM is absent."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from workers.engines.base import Sample, SamplingSpec, tokenizer_load, trim_at_stop


class HFEngine:
    kind = "transformers"

    def __init__(self, *, path: str, version: int = 0, device: str | None = None, batch_size: int = 64) -> None:
        import torch

        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.batch_size = batch_size
        self._lock = threading.Lock()
        self._version: int | None = None
        self.path = ""
        self.tokenizer = tokenizer_load(path)
        self.model: Any = None
        self.load(version=version, path=path)

    @property
    def version(self) -> int | None:
        return self._version

    def load(self, *, version: int, path: str) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        dtype = torch.float32 if self.device == "cpu" else torch.bfloat16
        with self._lock:
            model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(self.device)
            model.eval()
            self.model, self.path, self._version = model, path, version
            self.max_model_len = int(getattr(model.config, "max_position_embeddings", 0) or 0)

    def _eos_ids(self) -> set[int]:
        ids = self.model.generation_config.eos_token_id
        ids = ids if isinstance(ids, list) else [ids]
        return {i for i in ids + [self.tokenizer.eos_token_id] if i is not None}

    def generate(self, prompts: Sequence[Sequence[int]], *, n: int, sampling: SamplingSpec) -> list[list[Sample]]:
        if n < 1:
            raise ValueError("n must be at least 1")
        out: list[list[Sample]] = []
        with self._lock:
            per_call = max(1, self.batch_size // n)
            for start in range(0, len(prompts), per_call):
                out.extend(self._generate_chunk(prompts[start : start + per_call], n=n, sampling=sampling))
        return out

    def _generate_chunk(self, prompts: Sequence[Sequence[int]], *, n: int, sampling: SamplingSpec) -> list[list[Sample]]:
        import torch

        pad = self.tokenizer.pad_token_id
        # generate refuses num_return_sequences > 1 when greedy: repeat the prompts instead.
        copies = n if sampling.greedy else 1
        rows = [p for p in prompts for _ in range(copies)]
        width = max(len(p) for p in rows)
        ids = torch.tensor([[pad] * (width - len(p)) + list(p) for p in rows], device=self.device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in rows], device=self.device)
        kwargs: dict[str, Any] = {
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
                top_k=sampling.top_k if sampling.top_k > 0 else None,
            )
        if sampling.stop:
            kwargs.update(stop_strings=list(sampling.stop), tokenizer=self.tokenizer)
        if sampling.seed is not None:
            torch.manual_seed(sampling.seed)
        with torch.inference_mode():
            result = self.model.generate(input_ids=ids, attention_mask=mask, **kwargs)
        generated = result.sequences[:, width:]
        steps = len(result.logits)
        logps = torch.stack([torch.log_softmax(s.float(), dim=-1) for s in result.logits], dim=1) if steps else None
        eos = self._eos_ids()
        samples: list[Sample] = []
        for row in range(generated.shape[0]):
            tokens: list[int] = []
            logprobs: list[float] = []
            top: list[list[tuple[int, float]]] | None = [] if sampling.logprobs else None
            finish = "length"
            for t in range(generated.shape[1]):
                token = int(generated[row, t])
                if token == pad and token not in eos:
                    # generate pads a row that a stop string ended while others go on.
                    finish = "stop"
                    break
                tokens.append(token)
                assert logps is not None
                logprobs.append(float(logps[row, t, token]))
                if top is not None:
                    values, indices = torch.topk(logps[row, t], sampling.logprobs)
                    top.append([(int(i), float(v)) for i, v in zip(indices.tolist(), values.tolist())])
                if token in eos:
                    finish = "stop"
                    break
            text = self.tokenizer.decode(tokens, skip_special_tokens=True)
            text, stopped = trim_at_stop(text, sampling.stop)
            if stopped:
                finish = "stop"
            samples.append(Sample(token_ids=tokens, logprobs=logprobs, text=text, finish_reason=finish, top_logprobs=top))
        return [samples[i * n : (i + 1) * n] for i in range(len(prompts))]
