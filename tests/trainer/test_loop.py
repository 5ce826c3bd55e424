"""The whole loop with the real explorer: conductor, explorer and trainer as Celery workers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from apps.buffer.models import Experience
from apps.runs.models import Run, WeightLoad
from apps.runs.services import run_transition
from bench.common import run_wait_ended
from tests.factories import make_run, make_taskset

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@torch.no_grad()
def _logprobs(model: Any, exp: Experience) -> list[float]:
    ids = torch.tensor([exp.token_ids])
    logits = model(input_ids=ids).logits[0, exp.prompt_length - 1 : -1]
    return torch.log_softmax(logits, -1).gather(-1, ids[0, exp.prompt_length :, None])[:, 0].tolist()


def test_after_the_trainer_publishes_v1_the_explorers_next_experiences_come_from_v1(
    owner: Any, tiny_model_dir: Path, celery_workers: Any
) -> None:
    from transformers import AutoModelForCausalLM

    celery_workers.start("explorer", "rollout", "workers.explorer")
    run = make_run(
        owner=owner, taskset=make_taskset(8, owner=owner), model=str(tiny_model_dir), mode="sync", total_steps=2,
        explore_batch_size=2, repeat_times=4, train_batch_size=8, engine="transformers",
        sampling={"temperature": 1.0, "max_tokens": 6}, trainer={"learning_rate": 5e-2, "loss_type": "grpo"},
        rewards=[{"name": "length_penalty", "params": {"max_chars": 4}}],
    )
    run_transition(run=run, action="start", actor=owner)
    run_wait_ended(run, seconds=240, poll=0.5)
    assert run.status == Run.Status.FINISHED, (run.status, run.error, celery_workers.log("explorer")[-3000:])
    assert run.current_version == 2
    step2 = [e for e in Experience.objects.filter(run=run).order_by("id") if e.metadata.get("step") == 2]
    assert step2 and {e.model_version for e in step2} == {1}
    assert WeightLoad.objects.filter(run=run, version=1).exists()
    # The explorer's logprobs are v1's, not v0's: it really generated with the new weights.
    v0 = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    v1 = AutoModelForCausalLM.from_pretrained(run.versions.get(number=1).checkpoint)
    exp = next(e for e in step2 if e.response_length > 0)
    stored = torch.tensor(exp.logprobs)
    torch.testing.assert_close(stored, torch.tensor(_logprobs(v1, exp)), atol=1e-4, rtol=1e-4)
    assert (stored - torch.tensor(_logprobs(v0, exp))).abs().max() > 1e-3
