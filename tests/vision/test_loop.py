"""The whole loop on pictures: conductor, explorer and trainer as real Celery workers run a
sync GRPO run of the tiny VLM over the vision taskset; the trainer publishes v1 and the
explorer's next experiences come from v1 with their pictures (the logprobs it stored are v1's
on the same pixels)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from apps.buffer.importers import taskset_import
from apps.buffer.models import Experience
from apps.runs.models import Run
from apps.runs.services import run_transition
from bench.common import run_wait_ended
from tests.factories import make_run
from tests.servers import Workers, redis_flush
from workers.models.vision_demo import TASKSET_ZIP

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture
def storage(tmp_path: Path, settings: Any) -> Path:
    # One storage for this process (the import writes the pictures) and the workers (they read them).
    settings.RFT_STORAGE_DIR = tmp_path / "storage"
    return tmp_path / "storage"


@pytest.fixture
def loop_workers(django_db_setup: Any, storage: Path, tmp_path: Path) -> Iterator[Workers]:
    redis_flush()
    workers = Workers(tmp_path, RFT_STORAGE_DIR=str(storage), RFT_CONDUCT_SECONDS="0.3", RFT_DISPATCH_TTL="60")
    try:
        workers.start_together(("conductor", "default", (), True), ("explorer", "rollout", ("workers.explore.explorer",), False),
                               ("trainer", "train", ("workers.trainer",), False))
        yield workers
    finally:
        workers.stop_all()
        redis_flush()


def _logprobs(model: Any, processor: Any, exp: Experience) -> list[float]:
    import torch

    from workers.vision import images_open, pixel_inputs

    ids = torch.tensor([exp.token_ids])
    with torch.no_grad():
        logits = model(input_ids=ids, **pixel_inputs(processor, [images_open(exp.metadata["images"])])).logits
    logits = logits[0, exp.prompt_length - 1 : -1]
    return torch.log_softmax(logits, -1).gather(-1, ids[0, exp.prompt_length :, None])[:, 0].tolist()


def test_a_sync_grpo_run_of_the_tiny_vlm_trains_and_explores_on_its_pictures(
    owner: Any, vision_model_dir: Path, loop_workers: Workers,
) -> None:
    import torch
    from transformers import AutoModelForImageTextToText

    from workers.vision import processor_load

    taskset = taskset_import(name="squares", path=vision_model_dir / TASKSET_ZIP, owner=owner)
    run = make_run(
        owner=owner, taskset=taskset, model=str(vision_model_dir), mode="sync", total_steps=2, explore_batch_size=2,
        repeat_times=4, train_batch_size=8, engine="transformers", rewards=[],
        sampling={"temperature": 1.0, "max_tokens": 10}, trainer={"learning_rate": 5e-2, "loss_type": "grpo"},
    )
    run_transition(run=run, action="start", actor=owner)
    run_wait_ended(run, seconds=420, poll=0.5)
    assert run.status == Run.Status.FINISHED, (run.status, run.error, loop_workers.log("trainer")[-3000:],
                                               loop_workers.log("explorer")[-3000:])
    assert run.current_version == 2
    experiences = list(Experience.objects.filter(run=run).select_related("task").order_by("id"))
    assert experiences and all(e.task is not None and e.metadata["images"] == e.task.images for e in experiences)
    assert {e.reward_parts.keys().__iter__().__next__() for e in experiences} == {"vision_answer"}
    step2 = [e for e in experiences if e.metadata.get("step") == 2]
    assert step2 and {e.model_version for e in step2} == {1}
    # The explorer generated with v1's weights on the pictures: its logprobs are v1's, not v0's.
    processor = processor_load(str(vision_model_dir))
    v0 = AutoModelForImageTextToText.from_pretrained(vision_model_dir)
    v1 = AutoModelForImageTextToText.from_pretrained(run.versions.get(number=1).checkpoint)
    exp = next(e for e in step2 if e.response_length > 0)
    stored = torch.tensor(exp.logprobs)
    torch.testing.assert_close(stored, torch.tensor(_logprobs(v1, processor, exp)), atol=1e-4, rtol=1e-4)
    assert (stored - torch.tensor(_logprobs(v0, processor, exp))).abs().max() > 1e-3
