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
