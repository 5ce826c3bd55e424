"""Rollout engines, resident per worker process.

`engine_for(cfg)` returns the process's engine for a run config's engine backend and base
model, creating it on first use; later tasks reuse it and only load other weights
(`engine_version_ensure`) between batches.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import threading
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

from workers.engines.base import RolloutEngine, Sample, SamplingSpec, prompt_ids
from workers.engines.hf_engine import HFEngine
from workers.engines.vllm_engine import VLLMEngine
from workers.weights.sync import received_take, receiver_ensure, weight_bytes

if TYPE_CHECKING:
    from apps.runs.ports import RunConfig

log = logging.getLogger(__name__)

__all__ = [
    "EngineWanted",
    "LoadInfo",
    "RolloutEngine",
    "Sample",
    "SamplingSpec",
    "engine_cache_clear",
    "engine_cache_close",
    "engine_cache_put",
    "engine_cached",
    "engine_create",
    "engine_for",
    "engine_last_load",
    "engine_options",
    "engine_version_ensure",
    "prompt_ids",
]

_ENGINES: dict[tuple[str, str, str], RolloutEngine] = {}
_LOCK = threading.Lock()


@dataclass(frozen=True)
class EngineWanted:
    """An engine named by backend and base model alone (a judge's, a paraphraser's): it has the
    engine's default options, as a run config without a `rollout` section would."""

    engine: str
    model: str


# What an engine is looked up by: a run config (`engine`, `model`, `rollout`, `trainer.lora`)
# or an engine named outright.
EngineConfig: TypeAlias = "RunConfig | EngineWanted"
# An engine's constructor options (engine_options): dtype, context length, memory share …
EngineOptions: TypeAlias = "dict[str, str | int | float]"


@functools.cache
def vllm_available() -> bool:
    try:
        import vllm  # noqa: F401
    except Exception:  # a broken install is as good as none here
        return False
    return True


def engine_create(*, backend: str, path: str, version: int = 0, **options: Any) -> RolloutEngine:
    if backend == "vllm":
        return VLLMEngine(path=path, version=version, **options)
    if backend == "transformers":
        return HFEngine(path=path, version=version, **options)
    raise ValueError(f"unknown engine {backend!r}; known: vllm, transformers")


def engine_options(cfg: EngineConfig, backend: str) -> EngineOptions:
    """The engine's constructor options from a run config's `rollout` section (and, for
    vLLM, the adapter rank to enable LoRA serving at): only those that differ from the
    engine's defaults, so a default config shares the default engine."""
    rollout = getattr(cfg, "rollout", None)
    options: EngineOptions = {}
    if rollout is not None and rollout.dtype != "auto":
        options["dtype"] = rollout.dtype
    if backend != "vllm":
        return options
    if rollout is not None:
        if rollout.max_model_len is not None:
            options["max_model_len"] = rollout.max_model_len
        if rollout.memory_share != 0.5:
            options["gpu_memory_utilization"] = rollout.memory_share
        if rollout.tensor_parallel_size != 1:
            options["tensor_parallel_size"] = rollout.tensor_parallel_size
    lora = getattr(getattr(cfg, "trainer", None), "lora", None)
    if lora is not None:
        options["max_lora_rank"] = int(lora.rank)
    return options


_Key = tuple[str, str, str]


def _cache_key(backend: str, model: str, options: EngineOptions) -> _Key:
    return backend, str(model), json.dumps(options, sort_keys=True)


def _key(cfg: EngineConfig, backend: str | None) -> tuple[_Key, EngineOptions]:
    backend = backend or cfg.engine
    if backend == "vllm" and not vllm_available():
        log.warning("vLLM is not importable on this worker; using the transformers engine")
        backend = "transformers"
    options = engine_options(cfg, backend)
    return _cache_key(backend, str(cfg.model), options), options


def engine_cached(cfg: EngineConfig, *, backend: str | None = None) -> bool:
    """Whether this process already holds the engine `engine_for(cfg)` would return."""
    with _LOCK:
        return _key(cfg, backend)[0] in _ENGINES


def engine_for(cfg: EngineConfig, *, backend: str | None = None) -> RolloutEngine:
    """The resident engine for a run config (`engine`, `model`, `rollout`), made on first use.

    Keyed by engine backend, base model and engine options, so runs of the same model and
    settings share one engine; a run's own versions are loaded into it by path. A config
    asking for vLLM where vLLM cannot be imported falls back to transformers, with a warning.
    """
    key, options = _key(cfg, backend)
    with _LOCK:
        engine = _ENGINES.get(key)
        if engine is None:
            engine = _ENGINES[key] = engine_create(backend=key[0], path=key[1], version=0, **options)
            receiver_ensure()  # NcclSync deployments: take the trainer's broadcasts from now on
        return engine


def engine_cache_put(*, backend: str, model: str, engine: RolloutEngine, options: EngineOptions | None = None) -> None:
    """Adopt an engine made elsewhere (tests share one vLLM engine per session)."""
    with _LOCK:
        _ENGINES[_cache_key(backend, str(model), options or {})] = engine


def engine_cache_drop(cfg: EngineConfig, *, backend: str | None = None) -> None:
    """Forget the engine `engine_for(cfg)` returns, and close it in a thread of its own: a
    load that failed or timed out left its weights unknown (workers.explore.explorer), and a load
    still stalled in it must not hold up this one."""
    import threading

    with _LOCK:
        engine = _ENGINES.pop(_key(cfg, backend)[0], None)
    if engine is not None:
        threading.Thread(target=engine.close, name="engine-close", daemon=True).start()


def engine_cache_clear() -> None:
    with _LOCK:
        _ENGINES.clear()


def engine_cache_close() -> None:
    """Stop every resident engine (those with processes of their own: vLLM's) and forget them all:
    a worker's shutdown, which would otherwise leave them to the interpreter's exit."""
    with _LOCK:
        engines = list(_ENGINES.values())
        _ENGINES.clear()
    for engine in engines:
        engine.close()


def engine_version_ensure(engine: RolloutEngine, *, version: int, path: str) -> bool:
    """Load `path` as `version` unless the engine already holds exactly that; True if it loaded.

    Compared by path as well as number: two runs of one base model share an engine and
    their version 3s differ. Tensors this process received by broadcast for that path
    (workers.weights.sync.NcclSync) go in directly when the engine can take them.
    """
    if engine.version == version and getattr(engine, "path", None) == path:
        return False

    received = received_take(path)
    apply = getattr(engine, "load_tensors", None)
    if received is not None and apply is not None and apply(version=version, path=path, tensors=received.tensors):
        _LAST_LOAD[engine] = LoadInfo(via="broadcast", bytes=received.bytes)
        return True  # the trainer's broadcast (NcclSync), no checkpoint read
    engine.load(version=version, path=path)
    _LAST_LOAD[engine] = LoadInfo(via="checkpoint", bytes=weight_bytes(Path(path)) if os.path.isdir(path) else 0)
    return True


@dataclass(frozen=True)
class LoadInfo:
    """How an engine got its last version: `broadcast` (NcclSync tensors) or `checkpoint`
    (files), and the weight bytes that took (safetensors files read, or tensors received)."""

    via: str
    bytes: int


_LAST_LOAD: weakref.WeakKeyDictionary[RolloutEngine, LoadInfo] = weakref.WeakKeyDictionary()


def engine_last_load(engine: RolloutEngine) -> LoadInfo | None:
    """What the last `engine_version_ensure` that loaded into `engine` moved, if any."""
    return _LAST_LOAD.get(engine)
