from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen2 with its tokenizer, built once per session (no hub)."""
    from workers.modelkit import tiny_model_save

    return tiny_model_save(tmp_path_factory.mktemp("tiny-model"), hidden_size=32, layers=2, heads=2, seed=0)


@pytest.fixture(scope="session")
def tokenizer(tiny_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture
def load_model(tiny_model_dir: Path) -> Any:
    """Loads a fresh copy of the tiny model each call: same weights, independent tensors."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)

    def load() -> Any:
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
        model.train()
        return model

    return load


# ----------------------------------------------------------------------------- real Celery workers

import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Iterator  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


class Workers:
    """Celery workers as subprocesses (`-P solo`), on the test database and this
    checkout's Redis database, started and killed by the tests."""

    def __init__(self, env: dict[str, str], logs: Path) -> None:
        self.env = env
        self.logs = logs
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, queues: str, *includes: str) -> None:
        log_path = self.logs / f"{name}.log"
        cmd = [sys.executable, "-m", "celery", "-A", "rftweb", "worker", "-P", "solo", "-Q", queues,
               "-n", f"{name}@%h", "--without-heartbeat", "--without-gossip", "--without-mingle", "-l", "INFO"]
        for module in includes:
            cmd += ["-I", module]
        if "default" in queues.split(","):
            # The worker of the loop's queue runs the loop's beat (apps/runs/orchestration.py).
            cmd += ["-B", "-s", str(self.logs / f"{name}-beat-schedule")]
        fh = log_path.open("ab")
        # A group of its own: SIGKILL must reach the beat process that `-B` forks too.
        self.procs[name] = subprocess.Popen(cmd, cwd=ROOT, env=self.env, stdout=fh, stderr=subprocess.STDOUT,
                                            start_new_session=True)
        # A trainer imports torch and TRL before it says ready (a minute on a loaded host).
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if b" ready." in log_path.read_bytes():
                return
            if self.procs[name].poll() is not None:
                raise RuntimeError(f"worker {name} exited: {log_path.read_text()[-3000:]}")
            time.sleep(0.3)
        raise RuntimeError(f"worker {name} did not come up: {log_path.read_text()[-3000:]}")

    def kill_all(self) -> None:
        """SIGKILL: no graceful shutdown, no message handed back, leases left behind."""
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
        self.procs.clear()

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        self.procs.clear()

    def log(self, name: str) -> str:
        path = self.logs / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""


def _redis_flush() -> None:
    import redis
    from django.conf import settings

    redis.Redis.from_url(settings.REDIS_URL).flushdb()


@pytest.fixture(scope="module")
def celery_workers(django_db_setup: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Workers]:
    """A conductor worker (queue default) and a trainer worker (queue train), shared by a
    module's tests (starting them costs seconds; tests that kill them start them again)."""
    from django.db import connection

    db = connection.settings_dict
    tmp_path = tmp_path_factory.mktemp("workers")
    storage = tmp_path / "storage"
    env = dict(os.environ)
    env.update({
        "DATABASE_URL": f"postgres://{db.get('HOST') or 'localhost'}:{db.get('PORT') or 5432}/{db['NAME']}",
        "DJANGO_SETTINGS_MODULE": "rftweb.settings",
        "RFT_STORAGE_DIR": str(storage),
        "RFT_CONDUCT_SECONDS": "0.3",
        "RFT_DISPATCH_TTL": "30",
        "RFT_LEASE_SECONDS": "8",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(ROOT),
    })
    env.pop("TEST_DATABASE_NAME", None)
    _redis_flush()
    workers = Workers(env, tmp_path)
    workers.start("conductor", "default")
    workers.start("trainer", "train", "workers.trainer")
    try:
        yield workers
    finally:
        workers.stop_all()
        _redis_flush()


def running_run(owner: Any, model_dir: Path, **config: Any) -> Any:
    """A train-mode GRPO run on `model_dir`, already running (no conductor involved)."""
    from apps.runs.models import Run
    from tests.factories import make_run, make_taskset

    defaults = {"model": str(model_dir), "train_batch_size": 8, "repeat_times": 4, "explore_batch_size": 2,
                "total_steps": 10, "mode": "train", "trainer": {"learning_rate": 1e-3, "loss_type": "grpo"}}
    defaults.update(config)
    run = make_run(owner=owner, taskset=make_taskset(owner=owner), **defaults)
    Run.objects.filter(pk=run.pk).update(status=Run.Status.RUNNING)
    run.refresh_from_db()
    return run
