"""Precision and memory: a precision the device lacks is refused with a message (and fails
the run saying so); gradient checkpointing gives the same loss and gradients while holding
fewer activations for the backward pass."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch

from apps.runs.models import Run
from tests.trainer.conftest import running_run
from tests.trainer.test_lora import LORA, _rollouts
from workers.trainer import resident as trainer_resident
from workers.weights.adapters import adapter_wrap
from workers.algorithms import Learner, LearnerSpec, TrainBatch
from workers.algorithms import trl_bridge as bridge
from workers.precision import PrecisionUnsupported, precision_check, precision_supported

pytestmark = pytest.mark.slow

CPU_HAS_BF16 = precision_supported("bf16", device="cpu") is None


@pytest.mark.skipif(CPU_HAS_BF16, reason="this CPU has native bfloat16: nothing to refuse")
def test_bf16_is_refused_on_a_cpu_without_native_bfloat16_with_the_reason() -> None:
    with pytest.raises(PrecisionUnsupported) as exc:
        precision_check("bf16", device="cpu")
    message = str(exc.value)
    assert message.startswith("trainer.precision: bf16 needs") and "use fp32" in message
    assert str(torch.backends.cpu.get_cpu_capability()) in message


def test_adamw_8bit_is_refused_on_a_cpu_with_the_reason_and_the_config_offers_it() -> None:
    from kernel.config import ConfigInvalid, config_validate
    from workers.precision import optimizer_check

    with pytest.raises(PrecisionUnsupported) as refused:
        optimizer_check("adamw_8bit", device="cpu")
    assert str(refused.value).startswith("trainer.optimizer: adamw_8bit (bitsandbytes) needs a CUDA GPU")
    optimizer_check("adamw", device="cpu")
    assert config_validate(data={"model": "m", "trainer": {"optimizer": "adamw_8bit"}}).trainer.optimizer == "adamw_8bit"
    with pytest.raises(ConfigInvalid) as exc:
        config_validate(data={"model": "m", "trainer": {"optimizer": "lion"}})
    assert "trainer.optimizer" in exc.value.errors


@pytest.mark.django_db
@pytest.mark.parametrize(("trainer", "message"), [
    ({"optimizer": "adamw_8bit"}, "trainer.optimizer: adamw_8bit (bitsandbytes) needs a CUDA GPU"),
    pytest.param({"precision": "bf16"}, "trainer.precision: bf16 needs a device with native bfloat16",
                 marks=pytest.mark.skipif(CPU_HAS_BF16, reason="this CPU has native bfloat16: nothing to refuse")),
], ids=["adamw_8bit on a cpu", "bf16 without native bfloat16"])
def test_a_run_this_trainer_cannot_train_fails_with_the_message_and_keeps_its_batch(
    owner: Any, tiny_model_dir: Path, settings: Any, tmp_path: Path, trainer: dict[str, str], message: str
) -> None:
    from apps.buffer.models import Experience
    from tests.factories import make_experiences
    from workers.trainer.task import train_step

    settings.RFT_STORAGE_DIR = tmp_path
    trainer_resident.RESIDENTS.clear()
    run = running_run(owner, tiny_model_dir, trainer={**trainer, "loss_type": "grpo"})
    make_experiences(run, groups=2, group_size=4)
    out = train_step.apply(args=(run.pk, 1)).get()
    assert out["status"] == "failed"
    run.refresh_from_db()
    assert run.status == Run.Status.FAILED
    assert message in run.error
    assert Experience.objects.filter(run=run, status="ready").count() == 8, "the batch was lost"


def test_fp16_training_is_refused_on_a_cpu_and_fp32_always_runs() -> None:
    with pytest.raises(PrecisionUnsupported, match="fp16 training needs a GPU"):
        precision_check("fp16", device="cpu")
    precision_check("fp32", device="cpu")


def test_the_run_config_offers_precision_and_checkpointing_and_names_bad_values() -> None:
    from kernel.config import ConfigInvalid, config_validate

    cfg = config_validate(data={"model": "m", "trainer": {"precision": "bf16", "gradient_checkpointing": True}})
    assert cfg.trainer.precision == "bf16" and cfg.trainer.gradient_checkpointing
    with pytest.raises(ConfigInvalid) as exc:
        config_validate(data={"model": "m", "trainer": {"precision": "fp8"}})
    assert "trainer.precision" in exc.value.errors


@contextmanager
def _activation_bytes(model: Any) -> Iterator[list[int]]:
    """Bytes of the tensors autograd keeps for the backward pass, weights excluded (each
    storage once). Checkpointed regions keep only their inputs."""
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}
    total = [0]

    def pack(t: torch.Tensor) -> torch.Tensor:
        ptr = t.untyped_storage().data_ptr()
        if ptr not in weights and ptr not in seen:
            seen[ptr] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield total
    total[0] = sum(seen.values())


def _loss_grads_memory(load_model: Any, tokenizer: Any, *, checkpointing: bool, lora: bool) -> tuple[float, dict[str, torch.Tensor], int]:
    torch.manual_seed(0)
    model = load_model()
    if lora:
        model = adapter_wrap(model=model, lora=LORA)
    spec = LearnerSpec(algorithm="grpo", params=bridge.TrainParams(), gradient_checkpointing=checkpointing,
                       lora=LORA if lora else None, algorithm_params={"loss_type": "grpo"})
    learner = Learner(spec=spec, model=model, tokenizer=tokenizer)
    learner.model.train()
    rollouts = _rollouts(groups=2, size=4) + _rollouts(groups=2, size=4, seed=5)
    with _activation_bytes(learner.model) as saved:
        loss, _ = learner.loss(TrainBatch(usual=rollouts))
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in learner.model.named_parameters() if p.grad is not None}
    return float(loss), grads, saved[0]


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_gradient_checkpointing_gives_the_same_loss_and_gradients_with_fewer_saved_activations(
    load_model: Any, tokenizer: Any, lora: bool
) -> None:
    loss, grads, plain = _loss_grads_memory(load_model, tokenizer, checkpointing=False, lora=lora)
    loss_ckpt, grads_ckpt, ckpt = _loss_grads_memory(load_model, tokenizer, checkpointing=True, lora=lora)
    assert loss_ckpt == pytest.approx(loss, abs=1e-6)
    assert grads.keys() == grads_ckpt.keys() and grads
    for name in grads:
        torch.testing.assert_close(grads_ckpt[name], grads[name], atol=1e-5, rtol=1e-4)
    assert ckpt < 0.7 * plain, f"checkpointing kept {ckpt} bytes of activations, without it {plain}"


def test_a_checkpointed_learner_steps(load_model: Any, tokenizer: Any) -> None:
    spec = LearnerSpec(algorithm="grpo", params=bridge.TrainParams(learning_rate=1e-2), gradient_checkpointing=True,
                       algorithm_params={"loss_type": "grpo"})
    learner = Learner(spec=spec, model=load_model(), tokenizer=tokenizer)
    before = learner.model.lm_head.weight.detach().clone()
    metrics = learner.step(TrainBatch(usual=_rollouts()))
    assert metrics["grad_norm"] > 0 and not torch.equal(before, learner.model.lm_head.weight)
    assert learner.model.is_gradient_checkpointing
