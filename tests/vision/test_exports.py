"""A vision run's exports are in TRL's vision-language dataset format: content parts with an
image part in the user turn and an `images` column; a datasets directory holds the pictures
themselves, and TRL's SFTTrainer takes one step on it with the tiny VLM's processor."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User

from apps.feedback.training_data import export_hf_dataset, export_jsonl_chunks
from apps.buffer.models import Task
from apps.buffer.services import experience_write
from tests.factories import experience_row, make_image_taskset, make_run

pytestmark = pytest.mark.django_db


def _vision_run(owner: User, tmp: Path) -> Any:
    taskset = make_image_taskset(3, owner=owner, tmp=tmp)
    run = make_run(owner=owner, taskset=taskset)
    tasks = list(Task.objects.filter(taskset=taskset).order_by("index"))
    rows = [experience_row(run, key=f"e{i}", group=f"g{t.pk}", task_id=t.pk, prompt_text=t.prompt, reward=float(i % 2),
                           response_text=f"<answer>{i % 4 + 1}</answer>", metadata={"images": list(t.images)})
            for i, t in enumerate([t for t in tasks for _ in range(2)])]
    experience_write(experiences=rows)
    return run, tasks


def test_the_jsonl_exports_carry_image_parts_and_the_pictures_digests(owner: User, tmp_path: Path) -> None:
    run, tasks = _vision_run(owner, tmp_path)
    grpo = [json.loads(line) for line in b"".join(export_jsonl_chunks(run=run, export_format="grpo")).splitlines()]
    assert [r["images"] for r in grpo] == [t.images for t in tasks]
    assert grpo[0]["prompt"] == [{"role": "user", "content": [{"type": "image", "text": None},
                                                               {"type": "text", "text": tasks[0].prompt}]}]
    sft = [json.loads(line) for line in b"".join(export_jsonl_chunks(run=run, export_format="sft")).splitlines()]
    assert sft and all(r["images"] and r["messages"][0]["content"][0]["type"] == "image" for r in sft)
    assert sft[0]["messages"][-1] == {"role": "assistant", "content": [{"type": "text", "text": "<answer>1</answer>"}]}


def test_a_datasets_export_holds_the_pictures_and_trl_trains_on_it(owner: User, tmp_path: Path, vision_model_dir: Path) -> None:
    import datasets
    import torch
    from transformers import AutoModelForImageTextToText

    from workers.algorithms import trl_bridge as bridge
    from workers.vision import processor_load

    run, tasks = _vision_run(owner, tmp_path)
    result = export_hf_dataset(run=run, export_format="sft", out_dir=tmp_path / "sft")
    ds = datasets.load_from_disk(str(tmp_path / "sft"))
    assert len(ds) == result.rows == 6
    picture = ds[0]["images"][0]
    assert picture.size == (32, 32)
    from apps.buffer.images import image_open

    assert picture.convert("RGB").tobytes() == image_open(tasks[0].images[0]).tobytes()

    grpo = datasets.load_from_disk(str(export_hf_dataset(run=run, export_format="grpo", out_dir=tmp_path / "grpo").path))
    assert grpo[0]["prompt"][0]["content"][0]["type"] == "image" and len(grpo[0]["images"]) == 1

    # The effect: TRL's SFTTrainer reads the export with the VLM's processor and takes a step.
    from trl import SFTConfig, SFTTrainer

    processor = processor_load(str(vision_model_dir))
    model = AutoModelForImageTextToText.from_pretrained(vision_model_dir, dtype=torch.float32)
    before = {n: p.detach().clone() for n, p in model.named_parameters() if "vision_model" in n}
    args = SFTConfig(**{**bridge.common_args(bridge.TrainParams(learning_rate=1e-2)), "max_steps": 1},
                     per_device_train_batch_size=2, max_length=None)
    trainer = SFTTrainer(model=model, args=args, train_dataset=ds, processing_class=processor)
    out = trainer.train()
    assert torch.isfinite(torch.tensor(out.training_loss))
    assert any(not torch.equal(p, before[n]) for n, p in model.named_parameters() if n in before)
