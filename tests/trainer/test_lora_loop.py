"""A LoRA run through the trainer step against real Postgres: what it publishes is an
adapter on the run's base, explorers' engines load it and generate the trainer's own greedy
text, a restart rebuilds the adapter, and the CLI exports it as adapter or merged weights."""

from __future__ import annotations

import json
from pathlib import Path
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from django.core.management import CommandError, call_command

from apps.buffer.services import experience_write
from apps.runs.models import Metric, ModelVersion, Run
from tests.factories import experience_row
from tests.trainer.conftest import running_run
from workers.trainer import resident as trainer_resident
from workers.weights.adapters import adapter_base, is_adapter_dir
from workers.trainer.step import trainer_step
from apps.runs.ports import run_view_of

pytestmark = [pytest.mark.django_db, pytest.mark.slow]

LORA = {"rank": 4, "alpha": 16.0, "target_modules": ["q_proj", "v_proj", "o_proj", "up_proj", "down_proj"]}
PROMPTS = ["What is 3 + 4?", "What is 12 + 5?", "What is 7 + 7?"]


@pytest.fixture(autouse=True)
def _storage(settings: Any, tmp_path: Path) -> Iterator[Path]:
    settings.RFT_STORAGE_DIR = tmp_path / "storage"
    trainer_resident.RESIDENTS.clear()
    yield settings.RFT_STORAGE_DIR
    trainer_resident.RESIDENTS.clear()


def _groups(run: Run, *, tag: str, groups: int = 2, size: int = 4) -> None:
    rows = [
        experience_row(run, key=f"{tag}g{g}-{i}", group=f"{tag}g{g}", prompt_len=3 + g, response_len=2 + i,
                       reward=float(i % 2), model_version=run.current_version)
        for g in range(groups) for i in range(size)
    ]
    experience_write(experiences=rows)


def _lora_run(owner: Any, model_dir: Path, **trainer: Any) -> Run:
    return running_run(owner, model_dir, trainer={"learning_rate": 0.05, "loss_type": "grpo", "lora": LORA, **trainer})


def _train(run: Run, steps: int, *, spare: int = 0) -> None:
    # All the data first: a train-mode run whose buffer runs dry after a step is finished.
    for step in range(1, steps + spare + 1):
        _groups(run, tag=f"s{step}")
    for step in range(1, steps + 1):
        out = trainer_step(run_id=run.pk, step=step)
        assert out["status"] == "trained", out
        run.refresh_from_db()


def _greedy_of(model: Any, tokenizer: Any, prompts: list[list[int]], max_tokens: int = 12) -> list[list[int]]:
    out = []
    model.eval()
    with torch.no_grad():
        for ids in prompts:
            seq = model.generate(input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                 max_new_tokens=max_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id)
            out.append(seq[0, len(ids):].tolist())
    return out


def _engine_greedy(engine: Any, prompts: list[list[int]], max_tokens: int = 12) -> list[list[int]]:
    from workers.engines import SamplingSpec

    groups = engine.generate(prompts, n=1, sampling=SamplingSpec(temperature=0.0, max_tokens=max_tokens))
    return [g[0].token_ids for g in groups]


def _trim(seqs: list[list[int]], eos: int) -> list[list[int]]:
    # HF generate pads after EOS; engines stop at it.
    return [s[: s.index(eos) + 1] if eos in s else s for s in seqs]


def test_a_lora_run_publishes_a_small_adapter_that_the_transformers_engine_generates_with(
    owner: Any, tiny_model_dir: Path, tokenizer: Any
) -> None:
    from workers.engines import engine_cache_clear, engine_for, engine_version_ensure, prompt_ids
    from workers.engines.hf_engine import HFEngine

    run = _lora_run(owner, tiny_model_dir)
    _train(run, 2, spare=2)  # step 3 below, and one more so the run goes on (its resident is read)
    version = ModelVersion.objects.get(run=run, number=2)
    checkpoint = Path(version.checkpoint)
    assert is_adapter_dir(checkpoint) and not (checkpoint / "model.safetensors").exists()
    assert Path(adapter_base(checkpoint)) == tiny_model_dir, "the version does not name the base it applies to"
    adapter_bytes = (checkpoint / "adapter_model.safetensors").stat().st_size
    full_bytes = (tiny_model_dir / "model.safetensors").stat().st_size
    assert adapter_bytes < full_bytes / 4
    sync_bytes = Metric.objects.filter(run=run, name="sync_bytes", step=2).values_list("value", flat=True).get()
    assert sync_bytes == adapter_bytes

    res = trainer_resident.RESIDENTS[run.pk]
    prompts = [prompt_ids(tokenizer, text=p) for p in PROMPTS]
    eos = tokenizer.eos_token_id
    trainer_text = _trim(_greedy_of(res.model, tokenizer, prompts), eos)
    with res.model.disable_adapter():
        base_text = _trim(_greedy_of(res.model, tokenizer, prompts), eos)
    assert trainer_text != base_text, "training left the greedy text as the base's: the check below would prove nothing"

    engine_cache_clear()
    try:
        engine = engine_for(run.cfg, backend="transformers")
        assert isinstance(engine, HFEngine)
        assert _engine_greedy(engine, prompts) == base_text  # version 0 is the base
        engine_version_ensure(engine, version=2, path=str(checkpoint))
        assert _engine_greedy(engine, prompts) == trainer_text
        # The next version only swaps the adapter's tensors on the held base.
        held = engine.model
        assert trainer_step(run_id=run.pk, step=3)["status"] == "trained"
        v3 = ModelVersion.objects.get(run=run, number=3).checkpoint
        engine_version_ensure(engine, version=3, path=v3)
        assert engine.model is held
        assert _engine_greedy(engine, prompts) == _trim(_greedy_of(trainer_resident.RESIDENTS[run.pk].model, tokenizer, prompts), eos)
    finally:
        engine_cache_clear()


def test_a_restarted_lora_trainer_rebuilds_the_same_adapter_and_optimizer(owner: Any, tiny_model_dir: Path) -> None:
    run = _lora_run(owner, tiny_model_dir, beta=0.05)
    _train(run, 3, spare=1)  # the run goes on: its trainer keeps the resident read below
    before = {n: p.detach().clone() for n, p in trainer_resident.RESIDENTS[run.pk].model.named_parameters() if p.requires_grad}
    trainer_resident.resident_drop(run.pk)
    res = trainer_resident.resident_for(run_view_of(run))
    after = {n: p.detach() for n, p in res.model.named_parameters() if p.requires_grad}
    assert before.keys() == after.keys() and all("lora_" in n for n in after)
    for name in before:
        torch.testing.assert_close(after[name], before[name], atol=0, rtol=0)
    assert res.ref_model is None, "a LoRA run loaded a second model as its reference"


def test_the_cli_exports_a_versions_adapter_and_its_merged_weights(
    owner: Any, tiny_model_dir: Path, tokenizer: Any, tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM

    from workers.engines import prompt_ids

    run = _lora_run(owner, tiny_model_dir)
    _train(run, 2, spare=1)  # the run goes on: its trainer keeps the resident read below
    call_command("rft", "weights", str(run.pk), "--version", "2", "--out", str(tmp_path / "adapter"))
    assert is_adapter_dir(tmp_path / "adapter")
    call_command("rft", "weights", str(run.pk), "--out", str(tmp_path / "merged"), "--merged")
    assert not is_adapter_dir(tmp_path / "merged")
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    prompts = [prompt_ids(tokenizer, text=p) for p in PROMPTS]
    expected = _greedy_of(trainer_resident.RESIDENTS[run.pk].model, tokenizer, prompts)
    assert _greedy_of(merged, tokenizer, prompts) == expected
    config = json.loads((tmp_path / "merged" / "config.json").read_text())
    assert config["model_type"] == "qwen2"

    with pytest.raises(CommandError, match="no version 7"):
        call_command("rft", "weights", str(run.pk), "--version", "7", "--out", str(tmp_path / "x"))
    with pytest.raises(CommandError, match="no trained version"):
        call_command("rft", "weights", str(run.pk), "--version", "0", "--out", str(tmp_path / "x"))


def test_a_run_config_validates_its_adapter_settings() -> None:
    from kernel.config import ConfigInvalid, config_validate

    cfg = config_validate(data={"model": "m", "trainer": {"lora": {"rank": 16}}})
    assert cfg.trainer.lora is not None and cfg.trainer.lora.rank == 16 and "q_proj" in cfg.trainer.lora.target_modules
    for bad, field in (
        ({"rank": 0}, "trainer.lora.rank"),
        ({"dropout": 1.5}, "trainer.lora.dropout"),
        ({"target_modules": []}, "trainer.lora.target_modules"),
        ({"target_modules": ["lm_head"]}, "trainer.lora.target_modules"),
        ({"target_modules": ["q_proj; rm"]}, "trainer.lora.target_modules"),
        ({"ranks": 8}, "trainer.lora.ranks"),
    ):
        with pytest.raises(ConfigInvalid) as exc:
            config_validate(data={"model": "m", "trainer": {"lora": bad}})
        assert field in exc.value.errors, (bad, exc.value.errors)
