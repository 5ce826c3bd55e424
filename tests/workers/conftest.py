"""Shared, expensive fixtures of the worker tests: the demo model (built once, cached under
the project's ignored .cache/ by its manifest), one transformers engine, one vLLM engine per
test session, and a real Celery worker subprocess serving the rollout queue."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.servers import celery_worker

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("RFT_TEST_CACHE", ROOT / ".cache"))

# vLLM and torch write caches under $HOME and /tmp unless told; keep them in the project.
for _name, _sub in (("VLLM_CACHE_ROOT", "vllm"), ("TORCHINDUCTOR_CACHE_DIR", "inductor"), ("XDG_CACHE_HOME", "xdg"), ("HF_HOME", "hf")):
    os.environ.setdefault(_name, str(CACHE / _sub))
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


@pytest.fixture(scope="session")
def hf_engine(demo_model_dir: Path) -> Any:
    from workers.engines import engine_cache_put
    from workers.engines.hf_engine import HFEngine

    engine = HFEngine(path=str(demo_model_dir))
    engine_cache_put(backend="transformers", model=str(demo_model_dir), engine=engine)
    return engine


@pytest.fixture(scope="session")
def vllm_engine(demo_model_dir: Path) -> Iterator[Any]:
    """One vLLM engine for the whole session (starting one costs 15–20 s on CPU)."""
    pytest.importorskip("vllm")
    from workers.engines import engine_cache_put
    from workers.engines.vllm_engine import VLLMEngine

    engine = VLLMEngine(path=str(demo_model_dir))
    engine_cache_put(backend="vllm", model=str(demo_model_dir), engine=engine)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def celery_rollout_worker(django_db_setup: Any, django_db_blocker: Any) -> Iterator[subprocess.Popen[bytes]]:
    """A real `celery worker -P solo -Q rollout` on the test database and this run's Redis,
    for one module: a session-wide one outlived its module and took other modules' rollout
    tasks when the files ran in another order."""
    with django_db_blocker.unblock(), celery_worker("rollout", name="rollout-test", log=CACHE / "test-celery-rollout.log") as proc:
        yield proc
