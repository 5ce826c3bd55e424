"""What every objective shares of TRL: the version check, the lock around TRL's process-wide
state, the arguments every TRL trainer is built with, padding, metrics, the fused head's
tiles, the optimizer.

We do not let TRL drive training (its `training_step` would generate, its data loaders want
a dataset): each objective (workers/algorithms/objectives/<name>.py) builds its TRL trainer
once around our resident model, then feeds its `compute_loss` with the inputs dict its own
pipeline would have built, and the learner steps the optimizer. That keeps the numerics
TRL's, and leans on private details of TRL 1.16 (the inputs dict's keys, `_metrics`,
`_get_per_token_logps_and_entropies`, `current_gradient_accumulation_steps`), here and in
the objectives. `tests/trainer/test_trl_bridge.py` pins each of them, so an upgrade that
moves them fails there, loudly, before a run trains on wrong numbers.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import logging
import shutil
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, ParamSpec, TypeAlias, TypeVar

import torch

from kernel.exceptions import UpstreamFailed

if TYPE_CHECKING:
    from datasets import Dataset
    from transformers import Trainer
    from trl import DPOTrainer, GRPOTrainer, SFTTrainer

# The TRL trainers the built-in objectives build and ask for losses.
TrlTrainer: TypeAlias = "GRPOTrainer | DPOTrainer | SFTTrainer | Trainer"

log = logging.getLogger(__name__)

TRL_VERSION = "1.16.0"

# transformers' TrainingArguments (every TRL config) resets accelerate's process-wide
# AcceleratorState when it is built, and TRL's losses read that state. Where two learners or
# a learner and the reward worker share a process (the embedded default: `rft_serve` runs two
# runs' trainers as threads), one building a trainer under the other's loss failed its step
# ("`AcceleratorState` object has no attribute `_mixed_precision`"). Building a TRL trainer or
# config and computing a loss with one hold this lock.
TRL_STATE_LOCK = threading.RLock()

_Built = TypeVar("_Built")
_Args = ParamSpec("_Args")


def holding_trl_state(build: Callable[_Args, _Built]) -> Callable[_Args, _Built]:
    """`build` (a TRL config and trainer) runs holding TRL_STATE_LOCK, whoever calls it, with
    vLLM and MLflow hidden from TRL's imports (`_unused_backends_hidden_from_trl`)."""

    @functools.wraps(build)
    def held(*args: _Args.args, **kwargs: _Args.kwargs) -> _Built:
        with TRL_STATE_LOCK, _unused_backends_hidden_from_trl():
            return build(*args, **kwargs)

    return held


@contextlib.contextmanager
def _unused_backends_hidden_from_trl() -> Iterator[None]:
    """While TRL's trainer modules are first imported, TRL sees vLLM and MLflow as not
    installed (the availability checks trl.generation and trl.extras.profiling bind at
    import), unless this process imported them itself. TRL's GRPO trainer imports its vLLM
    client, and with it vLLM (~400 modules, ~4 CPU s), and its profiling imports MLflow
    (~1.3 CPU s), in every learner process (each rank, follower and train worker): for
    generation and metrics reporting we never let TRL do (no `use_vllm`, `report_to` empty).
    An engine or tracker that imports either later is not affected. Callers hold
    TRL_STATE_LOCK (no other TRL build reads the attributes meanwhile)."""
    from transformers import integrations
    from trl import import_utils

    hidden = [(module, name) for module, name, package in ((import_utils, "is_vllm_available", "vllm"),
                                                           (integrations, "is_mlflow_available", "mlflow"))
              if package not in sys.modules]
    real = [getattr(module, name) for module, name in hidden]
    for module, name in hidden:
        setattr(module, name, lambda *_, **__: False)
    try:
        yield
    finally:
        for (module, name), function in zip(hidden, real):
            setattr(module, name, function)


class TrlApiMoved(UpstreamFailed, RuntimeError):
    """The installed TRL is not the one this bridge was written and tested against."""

    code = "trl_api_moved"


def trl_check() -> str:
    import datasets
    import trl

    # Our dummy datasets are one row; their progress bars are noise in worker logs.
    datasets.disable_progress_bars()

    if trl.__version__ != TRL_VERSION:
        raise TrlApiMoved(
            f"workers/algorithms/trl_bridge.py is written against trl=={TRL_VERSION}, found {trl.__version__}; "
            "run tests/trainer/test_trl_bridge.py and update the bridge before training"
        )
    version: str = trl.__version__
    return version


@dataclass(frozen=True)
class TrainParams:
    """What every TRL trainer is built with, whatever the algorithm (the run config's shared
    trainer settings; each algorithm's own are its `trainer.params`; no Django types here)."""

    learning_rate: float = 1e-5
    max_grad_norm: float = 1.0
    max_completion_length: int = 64
    total_steps: int = 100
    seed: int = 0


@functools.cache
def scratch_dir() -> str:
    """The one `output_dir` of every TRL trainer this process builds, removed when it exits.
    With saving and logging off nothing is written there, but transformers' Trainer makes
    the folder when it is built: a fresh one per trainer left hundreds of empty folders in
    the temporary directory after a test run, and more on every run a worker rebuilt."""
    folder = tempfile.mkdtemp(prefix="rft-trl-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


def common_args(params: TrainParams) -> dict[str, object]:
    # CPU-safe, quiet, and nothing written unless we write it.
    return {
        "output_dir": scratch_dir(),
        "use_cpu": not torch.cuda.is_available(),
        "bf16": False,
        "fp16": False,
        "gradient_checkpointing": False,
        "learning_rate": params.learning_rate,
        "lr_scheduler_type": "constant",
        "max_grad_norm": params.max_grad_norm,
        "report_to": [],
        "save_strategy": "no",
        "logging_strategy": "no",
        "seed": params.seed,
        "gradient_accumulation_steps": 1,
        "remove_unused_columns": False,
        "dataloader_num_workers": 0,
        "disable_tqdm": True,
    }


def dummy_prompt_dataset(n: int) -> Dataset:
    from datasets import Dataset

    return Dataset.from_dict({"prompt": ["x"] * n})


def pad(seqs: list[list[int]] | list[list[float]], *, value: float, side: str, dtype: torch.dtype) -> torch.Tensor:
    from trl.trainer.utils import pad as trl_pad

    return trl_pad([torch.tensor(s, dtype=dtype) for s in seqs], padding_value=value, padding_side=side)


def on_model(trainer: TrlTrainer, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The batch's tensors on the device of the trainer's model (built on the CPU; a model
    on a GPU — cuda:rank in a learner gang — takes them there)."""
    device = next(trainer.model.parameters()).device
    for key, value in list(inputs.items()):
        if isinstance(value, torch.Tensor) and value.device != device:
            inputs[key] = value.to(device)
    return inputs


def fused_head(model: torch.nn.Module, *, temperature: float = 1.0) -> None:
    """TRL scores tokens through a patched forward (`fused_lm_head=True`); a model we bring
    (our reference, loaded from the run's v0) needs the same patch, once."""
    from trl.trainer.utils import add_fused_lm_head

    if not getattr(model, "_rft_fused_head", False):
        add_fused_lm_head(model, temperature=temperature)
        model._rft_fused_head = True


# The fused head's tiles where TRL has no Triton kernel (the CPU): tokens × vocabulary
# columns per projection. TRL's own (4096 × 32768, sized for a GPU) make one fp32 tile of
# a whole CPU batch by its whole vocabulary (4 × 96 tokens × 16k: 25 MB), and its torch
# fallback holds about eight tensors of the tile's size at once (the scaled logits, their
# exp, the products), in the forward and again in the backward: the largest transient of
# a LoRA step. Tiles of 256 × 4096 (4 MB) cut that to a few MB; the online logsumexp over
# vocabulary chunks gives the same logprobs and gradients within float rounding
# (tests/trainer/test_trl_bridge.py).
CPU_HEAD_TOKENS = 256
CPU_HEAD_VOCAB = 4096


def fused_head_tiles(*, tokens: int, vocab: int) -> tuple[int, int]:
    """Set TRL's fused-head tile (tokens per tile, vocabulary columns per tile) for this
    process; returns the previous pair. TRL reads both at each call."""
    from trl.kernels import chunked_logprob
    from trl.trainer import utils

    before = (chunked_logprob.TOKEN_CHUNK_SIZE, utils._CHUNKED_LOGPROB_CHUNK_SIZE)
    chunked_logprob.TOKEN_CHUNK_SIZE = tokens
    utils._CHUNKED_LOGPROB_CHUNK_SIZE = vocab
    return before


def fused_head_tiles_for(device: torch.device | str) -> None:
    """Small tiles where the head runs TRL's torch fallback; TRL's on a Triton device."""
    from trl.kernels.chunked_logprob import _use_triton

    if not _use_triton(torch.device(device)):
        fused_head_tiles(tokens=CPU_HEAD_TOKENS, vocab=CPU_HEAD_VOCAB)


def reference_adapter_drop(model: torch.nn.Module) -> None:
    """Remove the frozen "ref" adapter TRL adds beside a pre-existing one when beta > 0
    (its reference is then that copy; ours is the base with the adapter off)."""
    if "ref" in getattr(model, "peft_config", {}):
        model.delete_adapter("ref")
        model.set_adapter("default")


def metrics_drain(trainer: TrlTrainer) -> dict[str, float]:
    """The last value of each metric TRL logged during the call, then forget them (TRL
    keeps appending until its own `log`, which we never call)."""
    out: dict[str, float] = {}
    for mode in ("train", "eval"):
        for name, values in trainer._metrics[mode].items():
            if values:
                out[name] = float(values[-1])
        trainer._metrics[mode].clear()
    return out


# ----------------------------------------------------------------------------- optimizer


def optimizer_build(*, trainer: TrlTrainer, total_steps: int, optimizer: str = "adamw"
                    ) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    """The optimizer and scheduler the trainer would use (AdamW from TrainingArguments;
    optimizer adamw_8bit: transformers' `adamw_bnb_8bit`, bitsandbytes' AdamW8bit)."""
    if optimizer == "adamw_8bit":
        trainer.args.optim = "adamw_bnb_8bit"
    trainer.create_optimizer_and_scheduler(num_training_steps=max(1, total_steps))
    return trainer.optimizer, trainer.lr_scheduler


@holding_trl_state
def plain_trainer_build(*, model: torch.nn.Module, params: TrainParams) -> Trainer:
    """A transformers Trainer around `model`, for its optimizer and scheduler only: an
    objective whose loss is its own (no TRL trainer) gets the AdamW every TRL trainer makes."""
    from transformers import Trainer, TrainingArguments

    trl_check()
    return Trainer(model=model, args=TrainingArguments(**common_args(params)))
