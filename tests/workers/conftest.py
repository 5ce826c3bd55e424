"""Shared, expensive fixtures of the worker tests: the demo model (built once, cached under
the project's ignored .cache/ by its manifest), one transformers engine, one vLLM engine per
test session, and a real Celery worker subprocess serving the rollout queue."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("RFT_TEST_CACHE", ROOT / ".cache"))

# vLLM and torch write caches under $HOME and /tmp unless told; keep them in the project.
for _name, _sub in (("VLLM_CACHE_ROOT", "vllm"), ("TORCHINDUCTOR_CACHE_DIR", "inductor"), ("XDG_CACHE_HOME", "xdg"), ("HF_HOME", "hf")):
    os.environ.setdefault(_name, str(CACHE / _sub))
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


@pytest.fixture(scope="session")
def demo_model_dir() -> Path:
    """The real demo model (the `rft_demo_model` default settings), built once per cache."""
    from workers.demo_model import demo_model_build

    result = demo_model_build(out=CACHE / "test-demo-model", progress=False, log=lambda _: None)
    return result.out


@pytest.fixture(scope="session")
def hf_engine(demo_model_dir: Path) -> Any:
    from workers.engines import engine_cache_put
    from workers.engines.hf_engine import HFEngine

    engine = HFEngine(path=str(demo_model_dir))
    engine_cache_put(kind="transformers", model=str(demo_model_dir), engine=engine)
    return engine


@pytest.fixture(scope="session")
def vllm_engine(demo_model_dir: Path) -> Iterator[Any]:
    """One vLLM engine for the whole session (starting one costs 15–20 s on CPU)."""
    pytest.importorskip("vllm")
    from workers.engines import engine_cache_put
    from workers.engines.vllm_engine import VLLMEngine

    engine = VLLMEngine(path=str(demo_model_dir))
    engine_cache_put(kind="vllm", model=str(demo_model_dir), engine=engine)
    yield engine
    engine.close()


def _worker_env(db_name: str) -> dict[str, str]:
    env = dict(os.environ)
    # The worker talks to the test database pytest-django created, not the dev one.
    base = env.get("DATABASE_URL", "postgres://localhost:5432/test").rsplit("/", 1)[0]
    env["DATABASE_URL"] = f"{base}/{db_name}"
    env.pop("TEST_DATABASE_NAME", None)
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONPATH"] = str(ROOT)
    return env


@pytest.fixture(scope="session")
def celery_rollout_worker(django_db_setup: Any, django_db_blocker: Any) -> Iterator[subprocess.Popen[bytes]]:
    """A real `celery worker -P solo -Q rollout` on the test database and this run's Redis."""
    from django.db import connection

    from rftweb.celery import app

    with django_db_blocker.unblock():
        db_name = connection.settings_dict["NAME"]
    app.control.purge()
    log_path = CACHE / "test-celery-rollout.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log = log_path.open("wb")
    name = f"rollout-test-{os.getpid()}@localhost"
    proc = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "rftweb", "worker", "-P", "solo", "-Q", "rollout",
         "-n", name, "--without-mingle", "--without-gossip", "-l", "INFO"],
        cwd=ROOT, env=_worker_env(db_name), stdout=log, stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"celery worker exited with {proc.returncode}; see {log_path}")
            if app.control.ping(destination=[name], timeout=1.0):
                break
        else:
            raise RuntimeError(f"celery worker did not answer within 90 s; see {log_path}")
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
