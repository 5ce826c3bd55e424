"""An explore step on the tiny VLM writes experiences that reference their pictures (the
prompt tokens hold the image's tokens, the metadata its digests, the reward the vision rule's
check of the count), and a GRPO step on them runs through TRL with the pixels: the trainer's
logprobs of the stored completions match the rollout's only when the pictures go in."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User

from apps.buffer.importers import taskset_import
from apps.buffer.models import Experience
from apps.buffer.services import task_attempts_create
from apps.runs.models import Run
from apps.runs.services import run_transition
from tests.factories import make_run
from workers.models.vision_demo import TASKSET_ZIP


def vision_run(owner: User, model_dir: Path, *, engine: str = "transformers", tasks: int = 4, **config: Any) -> Run:
    taskset = taskset_import(name="squares", path=model_dir / TASKSET_ZIP, owner=owner)
    defaults: dict[str, Any] = {
        "model": str(model_dir), "engine": engine, "repeat_times": 4, "explore_batch_size": tasks, "rewards": [],
        "sampling": {"temperature": 1.0, "max_tokens": 12, "seed": 0},
        "trainer": {"learning_rate": 1e-3, "beta": 0.0},
    }
    defaults.update(config)
    run = make_run(owner=owner, taskset=taskset, **defaults)
    run_transition(run=run, action="start")
    task_attempts_create(run=run, epoch=0)
    return run


@pytest.fixture
def vision_engine(vision_model_dir: Path) -> Any:
    from workers.engines import engine_cache_clear

    engine_cache_clear()
    yield
    engine_cache_clear()


def explored(run: Run, model_dir: Path) -> list[Experience]:
    from transformers import AutoConfig

    from workers.explore.explorer import explore

    summary = explore(run_id=run.pk, step=1)
    assert summary["experiences"] == 16, summary
    image_token = AutoConfig.from_pretrained(model_dir).image_token_id
    experiences = list(Experience.objects.filter(run=run).select_related("task").order_by("id"))
    for e in experiences:
        assert e.task is not None and e.task.images
        assert e.metadata["images"] == e.task.images
        # The stored prompt is what the model saw: the picture's 4 tokens are in it.
        assert e.token_ids[: e.prompt_length].count(image_token) == 4 * len(e.task.images)
        # The default route of domain "vision": the rule check of the tagged count.
        assert set(e.reward_parts) == {"vision_answer"}
        assert e.reward == float(e.response_text.strip() == f"<answer>{e.task.reference}</answer>")
    return experiences


@pytest.mark.django_db
def test_an_explore_step_on_the_tiny_vlm_records_its_pictures_and_a_grpo_step_trains_on_them(
    owner: User, vision_model_dir: Path, vision_engine: None, settings: Any, tmp_path: Path,
) -> None:
    import torch

    settings.RFT_STORAGE_DIR = tmp_path / "storage"
    run = vision_run(owner, vision_model_dir)
    experiences = explored(run, vision_model_dir)
    # Sampled at temperature 1 from a model that is right about half the time: some right, some wrong.
    assert 0 < sum(e.reward or 0.0 for e in experiences) < len(experiences)

    from transformers import AutoModelForImageTextToText, AutoTokenizer

    from workers.algorithms import Learner, TrainBatch, rollout_from_experience, spec_from_config
    from workers.algorithms import trl_bridge as bridge
    from workers.algorithms.objectives import grpo
    from workers.vision import processor_load

    rollouts = [rollout_from_experience(e) for e in experiences]
    assert all(e.task is not None and r.images == e.task.images for r, e in zip(rollouts, experiences, strict=True))
    model = AutoModelForImageTextToText.from_pretrained(vision_model_dir, dtype=torch.float32)
    learner = Learner(spec=spec_from_config(run.cfg), model=model, tokenizer=AutoTokenizer.from_pretrained(vision_model_dir),
                      processor=processor_load(str(vision_model_dir)))

    # TRL's own per-token logprobs of the stored completions, with and without the pixels.
    inputs = grpo.inputs_build(trainer=learner.objective.trainer, prompt_ids=[r.prompt_ids for r in rollouts],
                                completion_ids=[r.completion_ids for r in rollouts], old_logprobs=None,
                                advantages=torch.zeros(len(rollouts)))
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    width = inputs["completion_ids"].size(1)
    model.eval()
    trl_trainer = learner.objective.trainer
    with torch.no_grad():
        seen, _, _ = trl_trainer._get_per_token_logps_and_entropies(model, ids, mask, width, **learner.pixel_inputs(rollouts))
        pixels = learner.pixel_inputs(rollouts)
        pixels["pixel_values"] = torch.zeros_like(pixels["pixel_values"]) + 1.0
        blind, _, _ = trl_trainer._get_per_token_logps_and_entropies(model, ids, mask, width, **pixels)
    stored = torch.zeros_like(seen)
    for i, r in enumerate(rollouts):
        stored[i, : len(r.logprobs or [])] = torch.tensor(r.logprobs or [])
    cm = inputs["completion_mask"].bool()
    assert (seen - stored)[cm].abs().max() < 1e-3
    assert (blind - stored)[cm].abs().max() > 1e-2

    vision_before = {n: p.detach().clone() for n, p in model.named_parameters() if "vision_model" in n}
    metrics = learner.step(TrainBatch(usual=rollouts))
    assert torch.isfinite(torch.tensor(metrics["loss"])) and metrics["grad_norm"] > 0
    # The loss reached the vision tower: the pictures took part in the step.
    moved = [n for n, p in model.named_parameters() if n in vision_before and not torch.equal(p, vision_before[n])]
    assert moved


@pytest.mark.django_db
def test_a_task_with_pictures_on_a_text_only_model_fails_the_step_naming_the_model(
    owner: User, vision_model_dir: Path, tmp_path: Path, settings: Any,
) -> None:
    from workers.engines import engine_cache_clear
    from workers.explore.explorer import explore
    from workers.models.tiny import tiny_model_save

    settings.RFT_STORAGE_DIR = tmp_path / "storage"
    text_model = tiny_model_save(tmp_path / "text", hidden_size=32, layers=1, heads=2)
    run = vision_run(owner, vision_model_dir, model=str(text_model))
    engine_cache_clear()
    try:
        with pytest.raises(Exception, match="not a vision-language model"):
            explore(run_id=run.pk, step=1)
    finally:
        engine_cache_clear()
    assert not Experience.objects.filter(run=run).exists()
    shutil.rmtree(text_model)


@pytest.mark.django_db
def test_held_out_evaluation_sends_the_pictures_too(
    owner: User, vision_model_dir: Path, vision_engine: None, settings: Any, tmp_path: Path,
) -> None:
    """Greedy evaluation of v0 on the picture taskset scores about what the warm-up measured:
    with the pictures left out it could only guess."""
    from apps.runs.models import Metric
    from workers.explore.evaluation import evaluate_version

    settings.RFT_STORAGE_DIR = tmp_path / "storage"
    eval_set = taskset_import(name="held-out", path=vision_model_dir / TASKSET_ZIP, owner=owner)
    run = vision_run(owner, vision_model_dir, eval_every=1,
                     eval={"taskset": eval_set.pk, "max_tasks": 64, "n": 1, "sampling": {"temperature": 0, "max_tokens": 12}})
    result = evaluate_version(run_id=run.pk, version=0)
    accuracy = Metric.objects.get(run=run, name="eval/accuracy").value
    assert result["reward_mean"] == accuracy
    # The model counts right about half the time from the pictures; one fixed guess is right a quarter.
    assert 0.35 < accuracy < 0.9


def test_the_vision_domain_is_scored_by_the_vision_rule_and_math_still_by_math_verify() -> None:
    from apps.rewards.scoring import rewards_inline

    vision = {"domain": "vision", "reference": "3", "metadata": {}}
    assert rewards_inline(terms=[], completion="<answer>3</answer>", task=vision).parts == {"vision_answer": 1.0}
    assert rewards_inline(terms=[], completion="<answer> 3.0 </answer>", task=vision).score == 1.0
    assert rewards_inline(terms=[], completion="three", task=vision).score == 0.0
    assert rewards_inline(terms=[], completion="<answer>4</answer>", task=vision).score == 0.0
    math = rewards_inline(terms=[], completion="<answer>3</answer>", task={"domain": "math", "reference": "3", "metadata": {}})
    assert set(math.parts) == {"math_accuracy", "math_format"}
