"""Rollout engines, resident per worker process.

`engine_for(cfg)` returns the process's engine for a run config's engine kind and base
model, creating it on first use; later tasks reuse it and only load other weights
(`engine_version_ensure`) between batches.
"""

from __future__ import annotations

import functools
import logging
import threading
from typing import Any

from workers.engines.base import RolloutEngine, Sample, SamplingSpec, prompt_ids

log = logging.getLogger(__name__)

__all__ = [
    "RolloutEngine",
    "Sample",
    "SamplingSpec",
    "engine_cache_clear",
    "engine_cache_put",
    "engine_cached",
    "engine_create",
    "engine_for",
    "engine_version_ensure",
    "prompt_ids",
]

_ENGINES: dict[tuple[str, str], RolloutEngine] = {}
_LOCK = threading.Lock()


@functools.cache
def vllm_available() -> bool:
    try:
        import vllm  # noqa: F401
    except Exception:  # a broken install is as good as none here
        return False
    return True


def engine_create(*, kind: str, path: str, version: int = 0, **options: Any) -> RolloutEngine:
    if kind == "vllm":
        from workers.engines.vllm_engine import VLLMEngine

        return VLLMEngine(path=path, version=version, **options)
    if kind == "transformers":
        from workers.engines.hf_engine import HFEngine

        return HFEngine(path=path, version=version, **options)
    raise ValueError(f"unknown engine {kind!r}; known: vllm, transformers")


def _key(cfg: Any, kind: str | None) -> tuple[str, str]:
    kind = kind or cfg.engine
    if kind == "vllm" and not vllm_available():
        log.warning("vLLM is not importable on this worker; using the transformers engine")
        kind = "transformers"
    return kind, str(cfg.model)


def engine_cached(cfg: Any, *, kind: str | None = None) -> bool:
    """Whether this process already holds the engine `engine_for(cfg)` would return."""
    with _LOCK:
        return _key(cfg, kind) in _ENGINES


def engine_for(cfg: Any, *, kind: str | None = None) -> RolloutEngine:
    """The resident engine for a run config (`engine`, `model`), made on first use.

    Keyed by engine kind and base model, so runs of the same model share one engine; a
    run's own versions are loaded into it by path. A config asking for vLLM where vLLM
    cannot be imported falls back to transformers, with a warning.
    """
    key = _key(cfg, kind)
    with _LOCK:
        engine = _ENGINES.get(key)
        if engine is None:
            engine = _ENGINES[key] = engine_create(kind=key[0], path=key[1], version=0)
        return engine


def engine_cache_put(*, kind: str, model: str, engine: RolloutEngine) -> None:
    """Adopt an engine made elsewhere (tests share one vLLM engine per session)."""
    with _LOCK:
        _ENGINES[(kind, str(model))] = engine


def engine_cache_clear() -> None:
    with _LOCK:
        _ENGINES.clear()


def engine_version_ensure(engine: RolloutEngine, *, version: int, path: str) -> bool:
    """Load `path` as `version` unless the engine already holds exactly that; True if it loaded.

    Compared by path as well as number: two runs of one base model share an engine and
    their version 3s differ.
    """
    if engine.version == version and getattr(engine, "path", None) == path:
        return False
    engine.load(version=version, path=path)
    return True
