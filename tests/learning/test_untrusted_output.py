"""Model output is untrusted: a sampled token can decode to NUL, which Postgres text refuses.
The explore step must still write its experiences (it failed the whole step before, and the
run stalled until the conductor re-sent it)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from apps.buffer.models import Experience
from apps.buffer.services import task_attempts_create
from apps.runs.services import run_transition
from workers.engines.base import Prompt
from tests.factories import make_run, make_taskset

pytestmark = pytest.mark.django_db


class NulSpeakingEngine:
    """The demo model's tokenizer with a completion that holds the NUL byte's token: what a
    small sampled model produced in the learning test, made deterministic here."""

    backend = "transformers"

    def __init__(self, path: str) -> None:
        from workers.engines.base import tokenizer_load

        self.tokenizer = tokenizer_load(path)
        self.path, self.version = path, 0

    def load(self, *, version: int, path: str) -> None:
        self.path, self.version = path, version

    def close(self) -> None:
        pass

    def generate(self, prompts: Sequence[Prompt], *, n: int, sampling: Any) -> list[list[Any]]:
        from workers.engines.base import Sample

        ids = self.tokenizer("<answer>4\x00</answer>", add_special_tokens=False)["input_ids"]
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        assert "\x00" in text
        return [[Sample(token_ids=ids, logprobs=[-1.0] * len(ids), text=text, finish_reason="stop")] * n for _ in prompts]


def test_an_explore_step_stores_completions_that_decode_to_nul(owner: Any, demo_model_dir: Path) -> None:
    from workers.engines import engine_cache_clear, engine_cache_put
    from workers.explore.explorer import explore

    run = make_run(owner=owner, taskset=make_taskset(2, owner=owner), model=str(demo_model_dir), repeat_times=2,
                   explore_batch_size=2, rewards=[{"name": "math_format"}])
    run_transition(run=run, action="start")
    task_attempts_create(run=run, epoch=0)
    engine_cache_put(backend="transformers", model=str(demo_model_dir), engine=NulSpeakingEngine(str(demo_model_dir)))
    try:
        summary = explore(run_id=run.pk, step=1)
    finally:
        engine_cache_clear()
    assert summary["experiences"] == 4
    texts = set(Experience.objects.filter(run=run).values_list("response_text", flat=True))
    assert texts == {"<answer>4\ufffd</answer>"}
