"""rftweb beside stock TRL on the same card (issue 66 item 4), for the prepared GPU check.

`scripts/gpu_check.py` runs rftweb's learner step (LoRA on a bf16 base; full weights under
FSDP2); this module runs what a team would run instead, on the same randomly initialised
model, the same batch (the same token ids, sequence lengths and rewards) and the same loss:

- `trl_step`: stock `trl.GRPOTrainer.train()` for a warm-up step and `steps` timed ones. The
  batch reaches it through TRL's own hook for outside completions (`rollout_func`, the same
  prompt and completion ids and stored logprobs rftweb's learner gets) and a reward function
  that returns the batch's rewards; `loss_type="grpo"`, `beta=0`, one generation per step,
  no gradient checkpointing, a constant learning rate 1e-5 and clipping at 1.0, as rftweb's.
  With LoRA, TRL's own `peft_config` of the same rank, alpha and modules. Timed from TRL's
  `on_step_begin` to `on_step_end` callbacks, so what TRL does inside a step counts.
- `generation`: the rollout throughput of rftweb's transformers engine against TRL's own
  generation (`GRPOTrainer._generate_single_turn`, what its `train()` calls without vLLM), the
  same prompts, completions per prompt, length and temperature, generated tokens per second.
- `learns`: rftweb's learner on one fixed batch for a few steps at a learning rate of 1e-4:
  the loss must go down and the weights must move; then the version it trained is written as
  safetensors (`whole_write`, a version's file) and loaded back through the product's
  meta-device path (`model_sharded_load`, how rank 0 of a learner gang builds from a version
  without holding the whole model): every tensor equal.

Each returns a `Figure` (scripts/gpu_kit.py); `ratios` turns the pairs into rftweb/TRL lines.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

# What both sides' LoRA adapters are: the rank and alpha scripts/gpu_check.py's LoRA step uses,
# on kernel.config.AdapterConfig's default modules.
LORA_RANK, LORA_ALPHA = 16, 32  # peft types lora_alpha an int
LEARNS_STEPS = 4
LEARNS_LR = 1e-4


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def trl_batch(rows: list[Any], batch: dict[str, int]) -> tuple[list[str], Any]:
    """(the dataset's prompts, TRL's `rollout_func`): prompt "gK" stands for group K; each time
    TRL hands over a prompt the function returns that group's next completion, so a step of
    `groups` prompts × `size` generations is exactly the batch rftweb's learner gets."""
    groups: dict[str, list[Any]] = {}
    for row in rows:
        groups.setdefault(str(row.group_id), []).append(row)

    def rollout_func(prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        taken: dict[str, int] = {}
        out: dict[str, list[Any]] = {"prompt_ids": [], "completion_ids": [], "logprobs": [], "fixed_reward": []}
        for prompt in prompts:
            key = str(prompt)
            row = groups[key][taken.get(key, 0) % batch["size"]]
            taken[key] = taken.get(key, 0) + 1
            out["prompt_ids"].append(list(row.prompt_ids))
            out["completion_ids"].append(list(row.completion_ids))
            out["logprobs"].append(list(row.logprobs))
            out["fixed_reward"].append(float(row.reward))
        return out

    return [f"g{gi}" for gi in range(batch["groups"])], rollout_func


def fixed_reward(completions: list[Any], fixed_reward: list[float], **_: Any) -> list[float]:
    """The batch's own rewards, handed over by `rollout_func` (TRL passes extra keys on)."""
    return list(fixed_reward)


def trl_trainer(*, model: Any, tokenizer: Any, batch: dict[str, int], rows: list[Any], steps: int, device: str,
                precision: str, lora: bool, generate: bool = False) -> Any:
    """Stock TRL's GRPOTrainer on `model`, set as rftweb's learner is (see the module's docstring)."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    prompts, rollout_func = trl_batch(rows, batch)
    args = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="rft-gpu-trl-"), use_cpu=device != "cuda", bf16=precision == "bf16",
        fp16=False, gradient_checkpointing=False, learning_rate=1e-5, lr_scheduler_type="constant",
        max_grad_norm=1.0, per_device_train_batch_size=batch["groups"] * batch["size"],
        num_generations=batch["size"], steps_per_generation=1, gradient_accumulation_steps=1,
        max_completion_length=batch["completion"], loss_type="grpo", beta=0.0, temperature=1.0,
        max_steps=steps + 1, report_to=[], save_strategy="no", logging_strategy="no", disable_tqdm=True,
        seed=0, remove_unused_columns=False, dataloader_num_workers=0, shuffle_dataset=False,
    )
    peft_config = None
    if lora:
        from peft import LoraConfig

        from kernel.config import AdapterConfig

        peft_config = LoraConfig(r=LORA_RANK, lora_alpha=LORA_ALPHA, lora_dropout=0.0, task_type="CAUSAL_LM",
                                 target_modules=AdapterConfig().target_modules)
    return GRPOTrainer(model=model, reward_funcs=[fixed_reward], args=args, processing_class=tokenizer,
                       train_dataset=Dataset.from_dict({"prompt": prompts}), peft_config=peft_config,
                       rollout_func=None if generate else rollout_func)


def step_timer(device: str) -> Any:
    """A TrainerCallback keeping each step's seconds (the device synchronised at both ends)."""
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):  # type: ignore[misc]
        def __init__(self) -> None:
            self.seconds: list[float] = []
            self.started = 0.0

        def on_step_begin(self, *args: Any, **kwargs: Any) -> None:
            _sync(device)
            self.started = time.perf_counter()

        def on_step_end(self, *args: Any, **kwargs: Any) -> None:
            _sync(device)
            self.seconds.append(time.perf_counter() - self.started)

    return StepTimer()


def trl_step(*, device: str, shape: dict[str, int], batch: dict[str, int], steps: int, lora: bool) -> Any:
    """Stock TRL's GRPO step on the check's model and batch: LoRA on a bf16 base, or full
    weights (fp32 master weights, bf16 autocast on a GPU) on one device."""
    import os

    import torch
    from transformers import PrinterCallback

    from scripts.gpu_kit import Figure, batch_tokens, model_build, peak_mb, rollouts, tokenizer_build

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    precision = "bf16" if device == "cuda" else "fp32"
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    dtype = torch.bfloat16 if lora and precision == "bf16" else torch.float32
    model = model_build(shape=shape, dtype=dtype, device=device)
    rows = rollouts(batch, vocab=shape["vocab_size"])
    trainer = trl_trainer(model=model, tokenizer=tokenizer_build(), batch=batch, rows=rows, steps=steps,
                          device=device, precision=precision, lora=lora)
    timer = step_timer(device)
    trainer.add_callback(timer)
    trainer.remove_callback(PrinterCallback)  # its dict of the run's logs, printed at the end
    trainer.train()
    timed = timer.seconds[1:] or timer.seconds
    seconds = sum(timed) / len(timed)
    what = f"LoRA on a {precision} base" if lora else f"full weights ({'bf16 autocast, fp32 weights' if precision == 'bf16' else precision}), 1 device"
    return Figure(f"stock TRL GRPOTrainer step, {what}", len(timer.seconds) == steps + 1,
                  f"{len(timer.seconds)} steps ran",
                  {"peak MiB": peak_mb(device), "tokens/s": batch_tokens(batch) / seconds, "s/step": seconds})


def generation(*, device: str, shape: dict[str, int], batch: dict[str, int]) -> Any:
    """Generated tokens per second: rftweb's transformers engine and TRL's own generation,
    the same model, prompts, completions per prompt, length and temperature; one warm-up
    call each, then one timed."""
    import torch

    from scripts.gpu_kit import Figure, model_build, rollouts, tokenizer_build
    from workers.engines.base import SamplingSpec
    from workers.engines.hf_engine import HFEngine

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    rows = rollouts(batch, vocab=shape["vocab_size"])
    prompts = [list(rows[g * batch["size"]].prompt_ids) for g in range(batch["groups"])]
    with tempfile.TemporaryDirectory(prefix="rft-gpu-gen-") as tmp:
        model = model_build(shape=shape, dtype=dtype, device="cpu")
        model.save_pretrained(tmp)
        tokenizer_build().save_pretrained(tmp)
        del model
        engine = HFEngine(path=tmp, device=device, batch_size=batch["groups"] * batch["size"],
                                    dtype="bfloat16" if device == "cuda" else "float32")
        sampling = SamplingSpec(temperature=1.0, max_tokens=batch["completion"], seed=0)
        engine.generate(prompts, n=batch["size"], sampling=sampling)
        _sync(device)
        started = time.perf_counter()
        samples = engine.generate(prompts, n=batch["size"], sampling=sampling)
        _sync(device)
        ours = sum(len(s.token_ids) for group in samples for s in group) / (time.perf_counter() - started)
        engine.close()
        del engine
        trl_model = model_build(shape=shape, dtype=dtype, device=device)
        trainer = trl_trainer(model=trl_model, tokenizer=tokenizer_build(), batch=batch, rows=rows, steps=1,
                              device=device, precision="bf16" if device == "cuda" else "fp32", lora=False,
                              generate=True)
        repeated = [p for p in prompts for _ in range(batch["size"])]
        trainer._generate_single_turn(repeated, None, {}, batch["size"])
        _sync(device)
        started = time.perf_counter()
        completion_ids, _ = trainer._generate_single_turn(repeated, None, {}, batch["size"])
        _sync(device)
        theirs = sum(len(c) for c in completion_ids) / (time.perf_counter() - started)
    return Figure("rollout: rftweb's transformers engine against TRL's own generation", ours > 0 and theirs > 0,
                  f"{len(prompts)} prompts x {batch['size']}, up to {batch['completion']} tokens, temperature 1",
                  {"rftweb tokens/s": ours, "TRL tokens/s": theirs, "ratio": ours / theirs})


def meta_load(version: Path, *, device: str, precision: str) -> dict[str, Any]:
    """A version's weights as the product loads one on the meta device (rank 0 of a learner
    gang: `model_sharded_load`, here a gang of one), each tensor whole on the CPU."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    from bench.common import free_port
    from workers.algorithms.sharding import model_sharded_load

    started_here = not dist.is_initialized()
    if started_here:
        dist.init_process_group("nccl" if device == "cuda" else "gloo", init_method=f"tcp://127.0.0.1:{free_port()}",
                                world_size=1, rank=0)
    try:
        model = model_sharded_load(version, mesh=init_device_mesh(device, (1,)), reshard=False, precision=precision)
        return {k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().cpu()
                for k, v in model.state_dict().items()}
    finally:
        if started_here:
            dist.destroy_process_group()


def learns(*, device: str, shape: dict[str, int], batch: dict[str, int]) -> Any:
    """rftweb's learner on one fixed batch: the loss goes down and the weights move; the
    version written as safetensors loads back through the meta-device path unchanged."""
    import math

    import torch

    from scripts.gpu_kit import Figure, learner_build, model_build, rollouts
    from workers.algorithms import TrainBatch
    from workers.algorithms.sharding import whole_write

    precision = "bf16" if device == "cuda" else "fp32"
    model = model_build(shape=shape, dtype=torch.float32, device=device)
    with tempfile.TemporaryDirectory(prefix="rft-gpu-learns-") as tmp:
        version = Path(tmp) / "v1"
        model.config.save_pretrained(version)
        before = {k: v.detach().clone() for k, v in model.state_dict().items()}
        learner = learner_build(model=model, precision=precision, adapter=None, completion=batch["completion"])
        for group in learner.optimizer.param_groups:
            group["lr"] = LEARNS_LR
        rows = rollouts(batch, vocab=shape["vocab_size"])
        losses = [float(learner.step(TrainBatch(usual=rows))["loss"]) for _ in range(LEARNS_STEPS)]
        trained = {k: v.detach().cpu() for k, v in learner.model.state_dict().items()}
        moved = max(float((v - before[k].cpu()).abs().max()) for k, v in trained.items() if v.is_floating_point())
        written = whole_write(learner, version / "model.safetensors")
        loaded = meta_load(version, device=device, precision=precision)
    differ = [k for k, v in trained.items() if k not in loaded or not torch.equal(v, loaded[k])]
    ok = all(math.isfinite(x) for x in losses) and losses[-1] < losses[0] and moved > 0 and not differ and written > 0
    detail = (f"loss {' -> '.join(f'{x:.4f}' for x in losses)} at lr {LEARNS_LR:g}; {len(trained)} tensors, "
              f"{len(differ)} differ after the round trip" + (f" ({', '.join(differ[:3])})" if differ else ""))
    return Figure("learns on a fixed batch; a version round-trips through the meta-device load", ok, detail,
                  {"largest weight change": moved, "version MiB": written / 2**20})


def ratios(figures: list[Any]) -> list[str]:
    """rftweb/TRL tokens per second and peak memory for each pair the check measured (target:
    rftweb at 1.0x stock TRL's throughput or better)."""
    by_name = {f.name: f for f in figures if f.ok}
    pairs = [("LoRA", "GRPO step, LoRA on a", "stock TRL GRPOTrainer step, LoRA on a"),
             ("full weights", "GRPO step, full weights under FSDP2", "stock TRL GRPOTrainer step, full weights")]
    lines = []
    for label, ours_prefix, theirs_prefix in pairs:
        ours = next((f for n, f in by_name.items() if n.startswith(ours_prefix)), None)
        theirs = next((f for n, f in by_name.items() if n.startswith(theirs_prefix)), None)
        if ours is None or theirs is None:
            lines.append(f"rftweb/TRL {label}: not measured (a side failed or did not run)")
            continue
        ours_peak = ours.values.get("peak MiB", ours.values.get("rank 0 peak MiB", 0.0))
        speed = ours.values["tokens/s"] / theirs.values["tokens/s"]
        memory = ours_peak / theirs.values["peak MiB"] if theirs.values["peak MiB"] else float("nan")
        lines.append(f"rftweb/TRL {label}: tokens/s {speed:.2f}x ({ours.values['tokens/s']:,.0f} against "
                     f"{theirs.values['tokens/s']:,.0f}; target >= 1.00x: {'met' if speed >= 1.0 else 'missed'}), "
                     f"peak memory {memory:.2f}x ({ours_peak:,.0f} against {theirs.values['peak MiB']:,.0f} MiB)")
    return lines
