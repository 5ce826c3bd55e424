"""A workers test: what the exports write is what TRL's trainers read. SFTTrainer and
DPOTrainer each take one optimizer step on an export, on a tiny local model."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from apps.feedback.training_data import export_hf_dataset, export_jsonl
from apps.buffer.services import experience_write
from apps.runs.models import Run
from tests.factories import experience_row

pytestmark = [pytest.mark.slow, pytest.mark.django_db]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from workers.models.tiny import tiny_model_save

    return tiny_model_save(tmp_path_factory.mktemp("model"), hidden_size=32, layers=1, heads=2)


def fill(run: Run) -> None:
    rows = []
    for g in range(4):
        for i in range(3):
            rows.append(experience_row(
                run, key=f"g{g}-{i}", group=f"g{g}", prompt_text=f"What is {g} + {i}?",
                response_text=f"<answer>{g + i if i else g - 1}</answer>", reward=float(i), model_version=g % 2,
            ))
    experience_write(experiences=rows)


def common_args(out: Path) -> dict[str, Any]:
    return {
        "output_dir": str(out), "max_steps": 1, "per_device_train_batch_size": 2, "learning_rate": 1e-3,
        "bf16": False, "use_cpu": True, "report_to": "none", "save_strategy": "no", "logging_steps": 1,
        "gradient_checkpointing": False, "disable_tqdm": True, "dataloader_num_workers": 0, "seed": 0,
    }


def trainable_weight(model: Any) -> Any:
    return next(p for p in model.parameters() if p.requires_grad).detach().clone()


def assert_one_step_moves_the_weights(trainer_class: Any, config_class: Any, *, tiny_model: Path, dataset: Any,
                                      out: Path) -> None:
    """The TRL trainer takes one optimizer step on `dataset`, with a finite loss, and it
    changes the model's weights."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    before = trainable_weight(model)
    trainer = trainer_class(model=model, args=config_class(**common_args(out), max_length=128), train_dataset=dataset,
                            processing_class=tokenizer)
    result = trainer.train()
    assert trainer.state.global_step == 1
    assert math.isfinite(result.training_loss)
    assert not trainable_weight(model).equal(before)


def test_sft_trainer_takes_a_step_on_the_sft_export(run: Run, tiny_model: Path, tmp_path: Path) -> None:
    import datasets
    from trl import SFTConfig, SFTTrainer

    fill(run)
    export_jsonl(run=run, export_format="sft", out=tmp_path / "sft.jsonl")
    export_hf_dataset(run=run, export_format="sft", out_dir=tmp_path / "sft-hf")
    from_jsonl = datasets.load_dataset("json", data_files=str(tmp_path / "sft.jsonl"), split="train",
                                       cache_dir=str(tmp_path / "cache"))
    dataset = datasets.load_from_disk(str(tmp_path / "sft-hf"))
    assert len(dataset) == len(from_jsonl) == 12
    assert_one_step_moves_the_weights(SFTTrainer, SFTConfig, tiny_model=tiny_model, dataset=dataset, out=tmp_path / "out")


def test_dpo_trainer_takes_a_step_on_the_dpo_export(run: Run, tiny_model: Path, tmp_path: Path) -> None:
    import datasets
    from trl import DPOConfig, DPOTrainer

    fill(run)
    export_jsonl(run=run, export_format="dpo", out=tmp_path / "dpo.jsonl")
    dataset = datasets.load_dataset("json", data_files=str(tmp_path / "dpo.jsonl"), split="train",
                                    cache_dir=str(tmp_path / "cache"))
    assert len(dataset) == 4
    assert_one_step_moves_the_weights(DPOTrainer, DPOConfig, tiny_model=tiny_model, dataset=dataset, out=tmp_path / "out")
