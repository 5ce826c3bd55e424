"""The transformers rollout engine: the embedded default and the fallback where vLLM is absent."""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from typing import Any

from workers.engines.base import FinishReason, Sample, SamplingSpec, tokenizer_load, trim_at_stop


class HFEngine:
    """Holds one model; `load` swaps in a version's weights. A LoRA version (a peft adapter
    directory) goes onto the base already held: the first one wraps it, later ones only
    replace the adapter's tensors."""

    kind = "transformers"

    def __init__(
        self, *, path: str, version: int = 0, device: str | None = None, batch_size: int = 64, dtype: str = "auto"
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
        self.model: Any = None
        self.load(version=version, path=path)

    @property
    def version(self) -> int | None:
        return self._version

    def load(self, *, version: int, path: str) -> None:
        from workers.adapters import is_adapter_dir

        with self._lock:
            if is_adapter_dir(path):
                self._adapter_load(path)
            else:
                self.model, self.base_path = self._full_load(path), path
            self.model.eval()
            self.path, self._version = path, version
            # The context the model was built for: the OpenAI endpoint refuses longer prompts.
            self.max_model_len = int(getattr(self.model.config, "max_position_embeddings", 0) or 0)

    def load_tensors(self, *, version: int, path: str, tensors: dict[str, Any]) -> bool:
        """Take a version's tensors as broadcast by the trainer (no checkpoint read): an
        adapter's onto the adapter held for the same base, full weights onto the model held.
        False when they do not fit what is held (the caller loads the checkpoint instead)."""
        from peft import set_peft_model_state_dict

        from workers.adapters import adapter_base, is_adapter_dir, is_adapter_model

        with self._lock:
            if is_adapter_dir(path):
                same_base = os.path.realpath(adapter_base(path)) == os.path.realpath(self.base_path)
                if not (is_adapter_model(self.model) and same_base):
                    return False
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

    def _full_load(self, path: str) -> Any:
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(path, dtype=self.dtype).to(self.device)

    def _adapter_load(self, path: str) -> None:
        import json
        from pathlib import Path

        from workers.adapters import (
            ADAPTER_CONFIG,
            adapter_base,
            adapter_load,
            adapter_weights_load,
            is_adapter_model,
        )

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

    def generate(self, prompts: Sequence[Sequence[int]], *, n: int, sampling: SamplingSpec) -> list[list[Sample]]:
        if n < 1:
            raise ValueError("n must be at least 1")
        out: list[list[Sample]] = []
        with self._lock:
            if sampling.seed is not None:
                import torch

                # Once per call, not per chunk: chunks seeded alike would draw the same
                # random numbers, and their samples would be correlated.
                torch.manual_seed(sampling.seed)
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
                # 0, not None: None means the generation config's default (50), which would
                # sample from a truncated distribution while the logprobs are the full one's.
                top_k=sampling.top_k if sampling.top_k > 0 else 0,
            )
        if sampling.stop:
            kwargs.update(stop_strings=list(sampling.stop), tokenizer=self.tokenizer)
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
            finish: FinishReason = "length"
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
