from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.servers import Workers, redis_flush

os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen2 with its tokenizer, built once per session (no hub)."""
    from workers.models.tiny import tiny_model_save

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

@contextmanager
def _conductor_and_trainer(tmp_path: Path, *more: tuple[str, str, tuple[str, ...], bool]) -> Iterator[Workers]:
    """The conductor and the trainer, and `more` workers (Workers.start_together's specs)
    started with them, so that their imports overlap."""
    redis_flush()
    workers = Workers(tmp_path, RFT_STORAGE_DIR=str(tmp_path / "storage"), RFT_CONDUCT_SECONDS="0.3",
                      RFT_DISPATCH_TTL="30", RFT_LEASE_SECONDS="8")
    workers.start_together(("conductor", "default", (), True), ("trainer", "train", ("workers.trainer",), False), *more)
    try:
        yield workers
    finally:
        workers.stop_all()
        redis_flush()


@pytest.fixture(scope="module")
def celery_workers(django_db_setup: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Workers]:
    """A conductor worker (queue default) and a trainer worker (queue train), shared by a
    module's tests (starting them costs seconds; tests that kill them start them again).
    While they live, the conductor advances every running run in the database, so a module
    whose other tests make running runs without a conductor uses `own_celery_workers`."""
    with _conductor_and_trainer(tmp_path_factory.mktemp("workers")) as workers:
        yield workers


@pytest.fixture(scope="module")
def loop_celery_workers(django_db_setup: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Workers]:
    """`celery_workers` with an explorer (queue rollout, evaluation included) started with
    them: the whole loop, once for a module's tests (tests/trainer/test_loop.py). A run
    leaves nothing another reads: the engines hold versions by path, the trainer its
    residents by run id."""
    explorer = ("explorer", "rollout", ("workers.explore.explorer", "workers.explore.evaluation"), False)
    with _conductor_and_trainer(tmp_path_factory.mktemp("loop-workers"), explorer) as workers:
        yield workers


@pytest.fixture
def own_celery_workers(django_db_setup: Any, tmp_path: Path) -> Iterator[Workers]:
    """The same two workers for one test only: gone before the next test makes its runs
    (the module-wide conductor once finished another test's runs under it)."""
    with _conductor_and_trainer(tmp_path) as workers:
        yield workers


def running_run(owner: Any, model_dir: Path, **config: Any) -> Any:
    """A train-mode GRPO run on `model_dir`, already running (no conductor involved)."""
    from apps.runs.models import Run
    from tests.factories import make_run, make_taskset

    defaults: dict[str, Any] = {"model": str(model_dir), "train_batch_size": 8, "repeat_times": 4, "explore_batch_size": 2,
                "total_steps": 10, "mode": "train", "trainer": {"learning_rate": 1e-3, "loss_type": "grpo"}}
    defaults.update(config)
    run = make_run(owner=owner, taskset=make_taskset(owner=owner), **defaults)
    Run.objects.filter(pk=run.pk).update(status=Run.Status.RUNNING)
    run.refresh_from_db()
    return run
