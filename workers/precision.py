"""Training precision: which of fp32 / bf16 / fp16 a device can run, and the autocast for it.

Mixed precision here is autocast around the forward and backward passes; weights and
optimizer state stay float32 (a LoRA base, frozen, is held in the low precision). A device
without native support is refused with a message, not emulated: bf16 on a CPU without
AVX512-BF16 or AMX runs many times slower than fp32, which is never what was meant.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

from kernel.exceptions import InvalidInput

if TYPE_CHECKING:
    import torch

PRECISIONS = ("fp32", "bf16", "fp16")


class PrecisionUnsupported(InvalidInput, ValueError):
    """The device cannot train in the precision the run asks for."""

    code = "precision_unsupported"


def _cpu_features() -> str:
    import torch

    return str(torch.backends.cpu.get_cpu_capability())


def precision_supported(precision: str, *, device: str) -> str | None:
    """None when `device` ('cpu' or 'cuda') supports `precision`, else the reason it does not."""
    import torch

    if precision not in PRECISIONS:
        return f"unknown precision {precision!r}; use one of {', '.join(PRECISIONS)}"
    if precision == "fp32":
        return None
    if device.startswith("cuda"):
        if precision == "bf16" and not torch.cuda.is_bf16_supported():
            return f"bf16 needs a GPU with bfloat16 support; {torch.cuda.get_device_name()} has none (use fp16 or fp32)"
        return None
    if precision == "bf16":
        native = torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
        if not native:
            return (f"bf16 needs a device with native bfloat16 (a GPU, or a CPU with AVX512-BF16 or AMX); "
                    f"this trainer's CPU has {_cpu_features()} only (use fp32)")
        return None
    return "fp16 training needs a GPU (a CPU has no fp16 autocast with loss scaling); use fp32 or bf16"


OPTIMIZERS = ("adamw", "adamw_8bit")


def optimizer_supported(name: str, *, device: str) -> str | None:
    """None when `device` can run optimizer `name`, else why not. AdamW with 8-bit state
    is bitsandbytes' (CUDA kernels; its CPU build has no 8-bit optimizers worth running)."""
    if name not in OPTIMIZERS:
        return f"unknown optimizer {name!r}; use one of {', '.join(OPTIMIZERS)}"
    if name == "adamw":
        return None
    if not device.startswith("cuda"):
        return "adamw_8bit (bitsandbytes) needs a CUDA GPU; this trainer runs on the CPU (use adamw)"
    import importlib.util

    if importlib.util.find_spec("bitsandbytes") is None:
        return "adamw_8bit needs the bitsandbytes package on the train worker (pip install bitsandbytes), or use adamw"
    return None


def optimizer_check(name: str, *, device: str) -> None:
    reason = optimizer_supported(name, device=device)
    if reason is not None:
        raise PrecisionUnsupported(reason, field="trainer.optimizer")


def precision_check(precision: str, *, device: str) -> None:
    reason = precision_supported(precision, device=device)
    if reason is not None:
        raise PrecisionUnsupported(reason, field="trainer.precision")


def precision_dtype(precision: str) -> torch.dtype:
    import torch

    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]


@contextlib.contextmanager
def autocast(precision: str, *, device: str) -> Iterator[None]:
    """Autocast to `precision` on `device` (nothing for fp32)."""
    import torch

    if precision == "fp32":
        yield
        return
    with torch.autocast(device_type="cuda" if device.startswith("cuda") else "cpu", dtype=precision_dtype(precision)):
        yield
