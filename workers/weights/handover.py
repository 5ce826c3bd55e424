"""In-memory weight handover, where the explorer and the trainer share a process.

With `CheckpointSync` every published version costs the trainer a `save_pretrained` and the
explorer a `from_pretrained` of the same bytes, both on the loop's critical path (on the
1.2M-parameter demo model about 50 and 100 ms a step, more under load). When this process
also holds the rollout engine for the run's model (bench/learning, the embedded default, a
worker serving both queues), `MemorySync` instead:

1. clones the trainer's state dict (a memcpy) and keeps it here under the version's
   checkpoint path;
2. records the `ModelVersion` at once, so the run goes on;
3. writes the same durable checkpoint directory in a background thread (atomic rename, as
   `CheckpointSync`), off the critical path.

The explorer in this process (`handover_apply`) copies the kept tensors into its engine's
model instead of reading the files. A reader in another process finds the directory once the
write is done: `checkpoint_pending` tells the explorer to wait (VersionNotReady) until then.
At most one write is in flight: the next publish waits for the previous one, so a crash can
leave only the newest version's directory unwritten, and that version is always the one at
the run's recorded train step, which `handover_repair` rewrites from the trainer's restored
state (bit-identical on CPU, see workers/trainer/).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workers.background import background_writer
from apps.runs.ports import model_version_publish, sync_failure_record, version_latest
from workers.engines import engine_cached
from workers.weights.sync import SyncFailed, process_name, save_pretrained_atomic, version_dir

if TYPE_CHECKING:
    import torch
    from transformers import PretrainedConfig, PreTrainedTokenizerBase

    from apps.runs.ports import RunConfig
    from apps.runs.ports import RunView

log = logging.getLogger(__name__)

_KEEP = 2  # versions kept in memory: the newest, and the one an explorer may still be loading
_LOCK = threading.Lock()
# path -> (state dict, model config)
_STATES: OrderedDict[str, tuple[dict[str, torch.Tensor], PretrainedConfig]] = OrderedDict()
_PENDING: dict[str, Future[Path]] = {}


def memory_sync_applies(cfg: RunConfig) -> bool:
    """Whether this process holds the rollout engine for the run's model: then an explorer
    shares the trainer's process and can take the weights from memory."""
    from django.conf import settings

    if settings.RFT_WEIGHT_SYNC != "checkpoint":
        return False

    return engine_cached(cfg)


def _write(*, model: torch.nn.Module, state: dict[str, torch.Tensor], tokenizer: PreTrainedTokenizerBase, out: Path,
           like: Path | None = None) -> Path:
    """`save_pretrained_atomic` of the cloned tensors: the live model goes on training while
    this runs, so only its config is read from it (none at all when `like`, the previous
    version's directory, serves as the layout: workers.weights.sync.weights_like)."""

    return save_pretrained_atomic(model=model, tokenizer=tokenizer, out=out, state=state, like=like)


def pending_wait() -> None:
    """Wait for the checkpoint write in flight, if any (its error is logged, not raised:
    the version is still in memory, and `handover_repair` can write it again)."""
    with _LOCK:
        futures = list(_PENDING.values())
    for future in futures:
        try:
            future.result()
        except Exception:
            log.exception("a background checkpoint write failed")


def _written_within(*, future: Future[Path], path: str, timeout: float, run_id: int, version: int, stage: str,
                    started: float) -> None:
    """Wait for the background write of `path` until `started + timeout` (monotonic); SyncFailed
    past it, naming the write. Its own error is logged, as `pending_wait` does."""
    try:
        future.result(timeout=max(0.0, started + timeout - time.monotonic()))
    except FutureTimeout:
        raise SyncFailed(method="memory", stage=stage, run_id=run_id, version=version, where=path,
                         worker=process_name(), seconds=time.monotonic() - started,
                         cause=f"the background checkpoint write of {path} did not finish within the run's "
                               f"sync_timeout_s ({timeout:g} s)") from None
    except Exception:
        log.exception("a background checkpoint write failed")


def sync_failure_note(exc: SyncFailed) -> None:
    """Record a failed sync for the run page's weight-sync timeline and its live event
    (apps.runs.services.sync_failure_record); never raises, so that the failure itself is
    what the caller sees. Here, not in workers.weights.sync, which the GPU check imports without Django."""
    try:
        sync_failure_record(run_id=exc.run_id, version=exc.version, method=exc.method, stage=exc.stage,
                            where=exc.where, worker=exc.worker, seconds=exc.seconds, message=exc.cause)
    except Exception:
        log.exception("could not record the sync failure: %s", exc)


def handover_has(path: str) -> bool:
    """Whether this process keeps the version at `path` in memory."""
    with _LOCK:
        return path in _STATES


def checkpoint_pending(path: str) -> bool:
    """Whether `path` is a version this process is still writing (readers wait for it)."""
    with _LOCK:
        future = _PENDING.get(path)
    return future is not None and not future.done()


class MemorySync:
    """`CheckpointSync`'s durable result, with the files written off the critical path and
    the weights handed to this process's explorer in memory."""

    name = "memory"

    def publish(self, *, run: RunView, number: int, train_step: int, model: torch.nn.Module,
                tokenizer: PreTrainedTokenizerBase) -> float:
        import torch

        started = time.perf_counter()
        # One write in flight at most (see the module docstring), waited for within the run's
        # bound: a write stalled on lost storage fails this publish rather than hanging it.
        waiting = time.monotonic()
        with _LOCK:
            pending = list(_PENDING.items())
        for path, previous in pending:
            _written_within(future=previous, path=path, timeout=run.config.sync_timeout_s, run_id=run.id, version=number,
                            stage="wait for the previous version's write", started=waiting)
        with torch.no_grad():
            state = {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}
        out = version_dir(run.id, number)
        key = str(out)
        with _LOCK:
            _STATES[key] = (state, model.config)
            _STATES.move_to_end(key)
            while len(_STATES) > _KEEP:
                _STATES.popitem(last=False)
            like = version_dir(run.id, number - 1) if number > 1 else None
            future = background_writer("handover-writer").submit(_write, model=model, state=state, tokenizer=tokenizer, out=out, like=like)
            _PENDING[key] = future
        future.add_done_callback(functools.partial(_forget_pending, key))
        model_version_publish(run=run, number=number, checkpoint=key, train_step=train_step)
        return time.perf_counter() - started


def _forget_pending(key: str, future: Future[Path]) -> None:
    with _LOCK:
        if _PENDING.get(key) is future:
            del _PENDING[key]


def handover_apply(engine: Any, *, version: int, path: str, run_id: int = 0, timeout: float = 600.0) -> bool:
    """Load `version` into `engine` from memory when this process published it; True if it
    did. An engine that cannot take tensors directly (vLLM's CPU backend repacks its weights
    on load) gets False after the files are written, and loads them as usual; a write not
    done within `timeout` seconds (the run's sync_timeout_s) raises SyncFailed."""
    with _LOCK:
        kept = _STATES.get(path)
        future = _PENDING.get(path)
    if kept is None:
        return False
    started = time.monotonic()

    def files_wait() -> None:
        if future is not None:
            _written_within(future=future, path=path, timeout=timeout, run_id=run_id, version=version,
                            stage="load (waits for its checkpoint write)", started=started)

    model = getattr(engine, "model", None)
    lock = getattr(engine, "_lock", None)
    if getattr(engine, "backend", None) != "transformers" or model is None or lock is None:
        files_wait()
        return False
    import torch

    state, _config = kept
    with lock, torch.no_grad():
        target = engine.model
        own = target.state_dict()
        if set(own) != set(state) or any(own[k].shape != state[k].shape for k in state):
            files_wait()
            return False  # another architecture: the files decide
        for name, tensor in state.items():
            own[name].copy_(tensor.to(own[name].device, own[name].dtype))
        engine.path, engine._version = path, version
    return True


def handover_repair(*, run: RunView, model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, train_step: int) -> bool:
    """After a restart: rewrite the newest published version's directory when a crash left
    it unwritten and it is the version of `train_step` (the weights just restored). True if
    it wrote."""

    latest = version_latest(run_id=run.id)
    if latest is None or not latest.checkpoint or Path(latest.checkpoint).exists() or checkpoint_pending(latest.checkpoint):
        return False
    if latest.train_step != train_step:
        log.warning("run %s: version %s's checkpoint %s is missing and not rebuildable from step %s",
                    run.id, latest.number, latest.checkpoint, train_step)
        return False
    save_pretrained_atomic(model=model, tokenizer=tokenizer, out=Path(latest.checkpoint))
    log.info("run %s: rewrote the checkpoint of version %s from step %s", run.id, latest.number, train_step)
    return True


def handover_clear() -> None:
    """Forget kept versions after waiting for the writes (tests, process shutdown)."""
    pending_wait()
    with _LOCK:
        _STATES.clear()
