"""The K-12 judge through the worker's resident rollout engines (workers.engines.engine_for:
the engine an explorer of the same model would use), transformers and vLLM, and a judge
model whose context cannot hold the prompt."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from apps.rewards.k12_taskset import k12_records
from workers.reward.k12 import k12_judge_verdicts

TASK = {"domain": "k12", "prompt": "Which planet is closest to the Sun?", "reference": "Mercury"}


@pytest.fixture(scope="module")
def judge_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random judge with a 1024-token context and a tokenizer that knows K-12 words."""
    from workers.models.tiny import tiny_model_save

    corpus = [f"{r['question']} {r['answer']} {g['answer']} Score: 7 Reason:" for r in k12_records()
              for g in r["graded_answers"]]
    return tiny_model_save(tmp_path_factory.mktemp("judge"), texts=corpus, vocab_size=600, max_positions=1024,
                          hidden_size=64, heads=2)  # head_dim 32: what vLLM's CPU attention supports


def _spy(engine: Any, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    generate = engine.generate

    def counted(prompts: Any, **kwargs: Any) -> Any:
        calls.append(len(prompts))
        return generate(prompts, **kwargs)

    monkeypatch.setattr(engine, "generate", counted)
    return calls


def _judge_on(kind: str, judge_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from workers.engines import EngineWanted, engine_for

    engine = engine_for(EngineWanted(engine=kind, model=str(judge_model_dir)))
    calls = _spy(engine, monkeypatch)
    verdicts = k12_judge_verdicts(["Mercury.", "Mars", "Venus"], [TASK] * 3, model=str(judge_model_dir),
                                  engine=kind, max_tokens=8)
    # One batch through the resident engine; a random judge's text is a verdict or a reason.
    assert calls == [3]
    assert len(verdicts) == 3 and all(0.0 <= v.score <= 1.0 and v.reason for v in verdicts)


def test_the_judge_runs_on_the_resident_transformers_engine(judge_model_dir: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    _judge_on("transformers", judge_model_dir, monkeypatch)


@pytest.mark.vllm
@pytest.mark.django_db(transaction=True)
def test_the_judge_runs_on_the_resident_vllm_engine(judge_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("vllm")
    from workers.engines import EngineWanted, engine_for
    from workers.engines.vllm_engine import VLLMEngine

    try:
        _judge_on("vllm", judge_model_dir, monkeypatch)
    finally:
        engine = engine_for(EngineWanted(engine="vllm", model=str(judge_model_dir)))
        assert isinstance(engine, VLLMEngine)
        engine.close()


def test_a_prompt_longer_than_the_judges_context_scores_zero_unjudged(
        demo_model_dir: Path, hf_engine: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    calls = _spy(hf_engine, monkeypatch)
    with caplog.at_level(logging.WARNING, logger="workers.reward.k12"):
        verdicts = k12_judge_verdicts(["Mercury."], [TASK], model=str(demo_model_dir), max_tokens=8)
    assert calls == [] and verdicts[0].score == 0.0
    assert "use a judge with a longer context" in verdicts[0].reason and hf_engine.max_model_len == 256
    assert any("longer context" in r.getMessage() for r in caplog.records)
