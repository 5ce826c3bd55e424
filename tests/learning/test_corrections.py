"""Human corrections reach the trainer: `feedback_edit` writes text only (the web side has no
tokenizer), and the trainer tokenises it the way the explorer renders prompts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from apps.buffer.drafts import ExperienceDraft
from apps.buffer.models import Experience
from apps.buffer.services import experience_write
from apps.feedback.kinds.edit import feedback_edit
from kernel.rewards import reference_text
from apps.control.demo import demo_taskset_import
from apps.runs.models import Run
from tests.factories import first_task, make_run

pytestmark = [pytest.mark.slow, pytest.mark.django_db]


def _answer_logprob(model_dir: str | Path, tokenizer_dir: Path, prompt: str, answer: str) -> float:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from workers.engines import prompt_ids

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    p = prompt_ids(tokenizer, text=prompt)
    c = tokenizer(answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    ids = torch.tensor([p + c])
    with torch.no_grad():
        logits = model(input_ids=ids).logits
        logps = torch.log_softmax(logits[0, len(p) - 1 : -1], -1)
    return float(logps.gather(-1, torch.tensor(c)[:, None]).sum())


def test_an_sft_step_learns_from_a_human_correction_written_without_tokens(
    owner: Any, demo_model_dir: Path, tmp_path: Path, settings: Any
) -> None:
    from transformers import AutoTokenizer

    from workers.engines import prompt_ids
    from workers.trainer.journal import state_dir
    from workers.trainer.step import trainer_step

    settings.RFT_STORAGE_DIR = tmp_path
    taskset = demo_taskset_import(owner=owner, model_dir=demo_model_dir)
    # 1e-4: AdamW's first step moves every weight by about the learning rate whatever the
    # gradient's size, and at 1e-3 that step overshoots on this model (the answer's NLL went
    # 2.65 -> 8.61, as a hand-written AdamW step does; at 1e-4 it goes to 1.23).
    run = make_run(owner=owner, taskset=taskset, model=str(demo_model_dir), algorithm="sft", mode="train",
                   train_batch_size=4, total_steps=1, trainer={"learning_rate": 1e-4})
    task = first_task(taskset)
    tokenizer = AutoTokenizer.from_pretrained(demo_model_dir)
    prompt = prompt_ids(tokenizer, text=task.prompt)
    wrong = tokenizer("<answer>0</answer>", add_special_tokens=False)["input_ids"]
    parent_id = experience_write(experiences=[ExperienceDraft(
        run_id=run.pk, key="explore:1:0", group_id="attempt-1", task_id=task.pk,
        prompt_text=task.prompt, response_text="<answer>0</answer>", token_ids=prompt + wrong,
        prompt_length=len(prompt), logprobs=[-1.0] * len(wrong), reward=0.0,
    )]).ids[0]
    correction = f"<answer>{reference_text(task)}</answer>"
    _, expert = feedback_edit(run=run, author=owner, experience=parent_id, text=correction)
    assert expert.is_expert and not expert.token_ids
    Run.objects.filter(pk=run.pk).update(status=Run.Status.RUNNING)

    result = trainer_step(run_id=run.pk, step=1, worker="test-trainer")

    assert result["status"] == "trained", result
    expert.refresh_from_db()
    assert expert.status == Experience.Status.CONSUMED
    metrics = dict(run.metrics.filter(step=1).values_list("name", "value"))
    assert "skipped" not in metrics and metrics["batch_size"] == 1.0
    before = _answer_logprob(demo_model_dir, demo_model_dir, task.prompt, correction)
    after = _answer_logprob(state_dir(run.pk, 1), demo_model_dir, task.prompt, correction)
    assert after > before + 0.1, (before, after)
