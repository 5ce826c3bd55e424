"""The tiny VLM through vLLM's multimodal inputs: the same pictures and prompts give the
transformers engine's greedy tokens and logprobs, and an explore step on the vLLM engine
writes experiences that reference their pictures."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User

from apps.buffer.models import Experience

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


@pytest.fixture(scope="module")
def vllm_vision(vision_model_dir: Path) -> Iterator[Any]:
    pytest.importorskip("vllm")
    import os

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from workers.engines import engine_cache_put
    from workers.engines.vllm_engine import VLLMEngine

    engine = VLLMEngine(path=str(vision_model_dir), max_model_len=256)
    engine_cache_put(backend="vllm", model=str(vision_model_dir), engine=engine)
    yield engine
    engine.close()


def test_vllm_and_transformers_answer_the_same_pictures_alike(vision_model_dir: Path, vllm_vision: Any) -> None:
    from workers.engines import SamplingSpec
    from workers.engines.hf_engine import HFEngine
    from workers.vision import vision_prompt
    from workers.models.vision_demo import QUESTION, squares_image

    hf = HFEngine(path=str(vision_model_dir))
    rng = random.Random(7)
    prompts = [vision_prompt(hf.processor, text=QUESTION, images=[squares_image(count=n, rng=rng)]) for n in (1, 2, 3, 4, 2, 3)]
    greedy = SamplingSpec(temperature=0, max_tokens=12)
    a = hf.generate(prompts, n=1, sampling=greedy)
    b = vllm_vision.generate(prompts, n=1, sampling=greedy)
    assert [g[0].token_ids for g in a] == [g[0].token_ids for g in b]
    for x, y in zip(a, b, strict=True):
        assert max(abs(p - q) for p, q in zip(x[0].logprobs, y[0].logprobs, strict=True)) < 1e-3
    # The pictures matter to vLLM too: not every picture gets the same answer.
    assert len({tuple(g[0].token_ids) for g in b}) > 1


@pytest.mark.django_db
def test_an_explore_step_on_the_vllm_engine_records_its_pictures(
    owner: User, vision_model_dir: Path, vllm_vision: Any, settings: Any, tmp_path: Path,
) -> None:
    from tests.vision.test_explore_train import explored, vision_run

    settings.RFT_STORAGE_DIR = tmp_path / "storage"
    run = vision_run(owner, vision_model_dir, engine="vllm")
    experiences = explored(run, vision_model_dir)
    assert all(isinstance(e, Experience) and e.metadata["images"] for e in experiences)


def test_a_published_version_reloads_into_the_running_vllm_engine(vision_model_dir: Path, vllm_vision: Any, tmp_path: Path) -> None:
    """Weight sync for the VLM: a checkpoint of changed weights goes into the running engine
    (reload_weights), and its answers are then the new weights' on the same pictures."""
    import torch
    from transformers import AutoModelForImageTextToText

    from workers.engines import SamplingSpec
    from workers.engines.hf_engine import HFEngine
    from workers.vision import vision_prompt
    from workers.models.vision_demo import QUESTION, squares_image

    model = AutoModelForImageTextToText.from_pretrained(vision_model_dir, dtype=torch.float32)
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "vision_model" in name or "connector" in name:
                p.add_(torch.randn_like(p) * 0.5)
    checkpoint = tmp_path / "v1"
    model.save_pretrained(checkpoint)
    hf = HFEngine(path=str(vision_model_dir))
    rng = random.Random(3)
    prompts = [vision_prompt(hf.processor, text=QUESTION, images=[squares_image(count=n, rng=rng)]) for n in (1, 2, 3, 4)]
    greedy = SamplingSpec(temperature=0, max_tokens=12)
    before = vllm_vision.generate(prompts, n=1, sampling=greedy)
    try:
        vllm_vision.load(version=1, path=str(checkpoint))
        hf.load(version=1, path=str(checkpoint))
        after = vllm_vision.generate(prompts, n=1, sampling=greedy)
        expected = hf.generate(prompts, n=1, sampling=greedy)
    finally:
        vllm_vision.load(version=0, path=str(vision_model_dir))
    assert [g[0].token_ids for g in after] == [g[0].token_ids for g in expected]
    changed = [abs(a[0].logprobs[0] - b[0].logprobs[0]) > 1e-4 for a, b in zip(after, before, strict=True)]
    assert any(changed)
