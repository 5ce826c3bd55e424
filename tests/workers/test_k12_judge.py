"""The K-12 judge through the worker's resident rollout engines: the same engine object the
explorer of that model uses, vLLM included."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from workers.k12 import k12_judge_verdicts

TASK = {"domain": "k12", "prompt": "Which planet is closest to the Sun?", "reference": "Mercury"}


def _spy(engine: Any, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    generate = engine.generate

    def counted(prompts: Any, **kwargs: Any) -> Any:
        calls.append(len(prompts))
        return generate(prompts, **kwargs)

    monkeypatch.setattr(engine, "generate", counted)
    return calls


def test_the_judge_uses_the_resident_transformers_engine(demo_model_dir: Path, hf_engine: Any,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _spy(hf_engine, monkeypatch)
    verdicts = k12_judge_verdicts(["Mercury.", "Mars"], [TASK] * 2, model=str(demo_model_dir), max_tokens=8)
    assert calls == [2]
    assert all(0.0 <= v.score <= 1.0 and v.reason for v in verdicts)


@pytest.mark.vllm
@pytest.mark.django_db(transaction=True)
def test_the_judge_runs_on_the_vllm_engine(demo_model_dir: Path, vllm_engine: Any,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _spy(vllm_engine, monkeypatch)
    verdicts = k12_judge_verdicts(["Mercury.", "Mars", "Venus"], [TASK] * 3, model=str(demo_model_dir),
                                  engine="vllm", max_tokens=8)
    assert calls == [3]
    assert len(verdicts) == 3 and all(0.0 <= v.score <= 1.0 and v.reason for v in verdicts)
