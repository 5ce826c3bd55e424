"""A LoRA run's published adapter in vLLM (the CPU build): served as a LoRA request on the
base the engine holds, and, on an engine started without LoRA, merged into full weights.
Either way the greedy text is the trainer's own."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from apps.runs.models import ModelVersion
from tests.trainer.test_lora_loop import (
    PROMPTS,
    _engine_greedy,
    _greedy_of,
    _lora_run,
    _train,
    _trim,
)
from workers.trainer import resident as trainer_resident

pytestmark = [pytest.mark.django_db, pytest.mark.slow, pytest.mark.vllm]

ROOT = Path(__file__).resolve().parents[2]
for _name, _sub in (("VLLM_CACHE_ROOT", "vllm"), ("TORCHINDUCTOR_CACHE_DIR", "inductor"), ("XDG_CACHE_HOME", "xdg")):
    os.environ.setdefault(_name, str(ROOT / ".cache" / _sub))
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


@pytest.fixture(autouse=True)
def _storage(settings: Any, tmp_path: Path) -> Any:
    settings.RFT_STORAGE_DIR = tmp_path / "storage"
    trainer_resident.RESIDENTS.clear()
    yield
    trainer_resident.RESIDENTS.clear()


@pytest.fixture(scope="module")
def vllm_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # vLLM's CPU attention wants a head size of 32 or more.
    from workers.models.tiny import tiny_model_save

    return tiny_model_save(tmp_path_factory.mktemp("vllm-lora-model"), hidden_size=64, layers=2, heads=2, seed=0)


def test_vllm_serves_a_published_adapter_with_the_trainers_greedy_text(owner: Any, vllm_model_dir: Path) -> None:
    pytest.importorskip("vllm")
    from transformers import AutoTokenizer

    from workers.engines import engine_cache_clear, engine_for, engine_version_ensure, prompt_ids
    from workers.engines.vllm_engine import VLLMEngine

    run = _lora_run(owner, vllm_model_dir)
    run.config = {**run.config, "engine": "vllm", "rollout": {"max_model_len": 256}}
    run.save(update_fields=["config"])
    _train(run, 2, spare=1)  # the run goes on: its trainer keeps the resident policy read below
    checkpoint = ModelVersion.objects.get(run=run, number=2).checkpoint
    tokenizer = AutoTokenizer.from_pretrained(vllm_model_dir)
    prompts = [prompt_ids(tokenizer, text=p) for p in PROMPTS]
    res = trainer_resident.RESIDENTS[run.pk]
    expected = _trim(_greedy_of(res.model, tokenizer, prompts), tokenizer.eos_token_id)
    with res.model.disable_adapter():
        base = _trim(_greedy_of(res.model, tokenizer, prompts), tokenizer.eos_token_id)
    assert expected != base, "training left the greedy text as the base's"

    engine_cache_clear()
    engine = engine_for(run.cfg)
    assert isinstance(engine, VLLMEngine)
    try:
        assert engine.backend == "vllm" and engine.lora_enabled
        assert engine.llm.llm_engine.model_config.max_model_len == 256  # rollout.max_model_len reached vLLM
        assert _engine_greedy(engine, prompts) == base
        engine_version_ensure(engine, version=2, path=checkpoint)
        assert _engine_greedy(engine, prompts) == expected
        # An engine without LoRA support gets the adapter merged into full weights instead.
        engine.lora_enabled = False
        engine_version_ensure(engine, version=1, path=str(vllm_model_dir))
        engine_version_ensure(engine, version=2, path=checkpoint)
        assert engine._lora is None
        assert _engine_greedy(engine, prompts) == expected
    finally:
        engine.close()
        engine_cache_clear()
