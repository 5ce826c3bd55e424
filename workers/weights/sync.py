"""Weight sync: how a trained version reaches the explorers.

`CheckpointSync` (the default, any hardware): the trainer writes a Hugging Face
`save_pretrained` directory under `RFT_STORAGE_DIR/runs/<id>/v<n>` (shared storage across
hosts), records the `ModelVersion`, and `weights.synced` goes out; explorers load the
directory at their next batch boundary (vLLM `reload_weights`, transformers
`load_state_dict`).

`NcclSync` (GPU hosts): the same checkpoint (so a restart, or an explorer that joins late,
still finds every version on disk), plus a broadcast of the tensors from the trainer's GPU
to the explorers' GPUs over an NCCL group, so explorers need not read the files.

Both publish through `apps.runs.services.model_version_publish`; which one a trainer uses is
`settings.RFT_WEIGHT_SYNC`. A LoRA run's versions are its adapter (workers.weights.adapters): the
same paths move megabytes instead of the whole model. Each publish reports the bytes it
wrote or sent and the seconds it took, and `weights.synced` carries both.

Every sync is bounded by the run's `sync_timeout_s` (`sync_bounded`, NcclSync's per-tensor
waits): one that stalls or fails raises `SyncFailed` naming what and where, which the caller
records on the run's weight-sync timeline (`workers.weights.handover.sync_failure_note`) instead of hanging.
"""

from __future__ import annotations

import functools
import os
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeVar

from kernel.exceptions import Unavailable
from workers.weights.adapters import adapter_save, is_adapter_dir, is_adapter_model

if TYPE_CHECKING:
    from django.conf import LazySettings
    import torch
    import torch.distributed as dist
    from transformers import PreTrainedTokenizerBase

    from apps.runs.ports import RunView


T = TypeVar("T")


class SyncUnavailable(Unavailable):
    """This weight-sync path cannot run on this host (e.g. NCCL without CUDA)."""

    code = "sync_unavailable"


class SyncFailed(Unavailable):
    """A weight sync or handover failed, or ran past the run's `sync_timeout_s`: what failed
    (the method and the stage), where (the path or address, the process) and why.

    Raised instead of waiting for ever (issue 66: TRL's weight sync hangs when a process is
    lost). The caller records it for the run page's weight-sync timeline
    (`workers.weights.handover.sync_failure_note`)."""

    code = "sync_failed"

    def __init__(self, *, method: str, stage: str, run_id: int, version: int, where: str, worker: str,
                 seconds: float, cause: str) -> None:
        self.method, self.stage, self.run_id, self.version = method, stage, run_id, version
        self.where, self.worker, self.seconds, self.cause = where, worker, seconds, cause
        super().__init__(f"{method} sync of run {run_id} version {version}: {stage} at {where} failed on {worker} "
                         f"after {seconds:.1f} s: {cause}")


def process_name() -> str:
    """This process, as a sync failure names where it happened."""
    import socket

    return f"{socket.gethostname()}:{os.getpid()}"


def sync_bounded(work: Callable[[], T], *, timeout: float, method: str, stage: str, run_id: int, version: int,
                    where: str, worker: str = "", abandoned: threading.Event | None = None) -> T:
    """`work()`, waited for at most `timeout` seconds; its error or the timeout as SyncFailed.

    It runs in a daemon thread of its own: a read or write stalled on lost storage cannot
    be interrupted, so on a timeout the thread is left behind and the caller goes on without
    it (what it was writing never replaces a version: `save_pretrained_atomic`'s `abandoned`,
    set here on a timeout)."""
    from concurrent.futures import Future
    from concurrent.futures import TimeoutError as FutureTimeout

    future: Future[T] = Future()

    def run() -> None:
        try:
            future.set_result(work())
        except BaseException as exc:  # handed to the waiting caller, raised there
            future.set_exception(exc)

    started = time.monotonic()
    threading.Thread(target=run, name=f"sync-{stage}", daemon=True).start()
    fail = functools.partial(SyncFailed, method=method, stage=stage, run_id=run_id, version=version, where=where,
                             worker=worker or process_name())
    try:
        return future.result(timeout=timeout)
    except FutureTimeout:
        if abandoned is not None:
            abandoned.set()
        raise fail(seconds=time.monotonic() - started,
                   cause=f"no answer within the run's sync_timeout_s ({timeout:g} s)") from None
    except SyncFailed:
        raise
    except Exception as exc:
        raise fail(seconds=time.monotonic() - started, cause=f"{type(exc).__name__}: {exc}") from exc


def _settings() -> LazySettings:
    """Django's settings, imported where a setting is read: workers.engines imports this module,
    and the GPU check runs the engines and learners on an image without Django (scripts/gpu_check.py)."""
    from django.conf import settings

    return settings


def run_storage(run_id: int) -> Path:
    return Path(_settings().RFT_STORAGE_DIR) / "runs" / str(run_id)


def version_dir(run_id: int, number: int) -> Path:
    return run_storage(run_id) / f"v{number}"


def save_pretrained_atomic(
    *, model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase | None, out: Path,
    state: dict[str, torch.Tensor] | None = None, like: Path | None = None, abandoned: threading.Event | None = None
) -> Path:
    """Write a save_pretrained directory so that readers see all of it or none of it:
    into a temporary sibling first, then one rename.

    state: the tensors to write (default: the model's own). like: a directory this one
    differs from in its weights only (the run's previous version): when `weights_like`
    can, the new weights go into a file laid out as that one's and its other files (config,
    generation config, tokenizer) are copied, instead of `save_pretrained` again.
    abandoned: set when the caller gave up waiting (`sync_bounded`'s timeout): the write
    then never replaces `out`, which a later try may have written since."""
    tmp = _tmp_for(out)
    if is_adapter_model(model):
        adapter_save(model=model, out=tmp)
    elif like is None or not weights_like(state=state if state is not None else model.state_dict(), like=like, out=tmp):
        if tmp.exists():
            shutil.rmtree(tmp)
        model.save_pretrained(tmp, safe_serialization=True, state_dict=state)
    else:
        tokenizer = None  # copied with the rest of `like`
    if tokenizer is not None:
        tokenizer.save_pretrained(tmp)
    _replace(tmp, out, abandoned)
    return out


def _tmp_for(out: Path) -> Path:
    """A fresh temporary sibling of `out`, its own per process and thread: a write a timeout
    left behind (`sync_bounded`) and the try after it never share one."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}-{threading.get_ident()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    return tmp


def _replace(tmp: Path, out: Path, abandoned: threading.Event | None) -> None:
    if abandoned is not None and abandoned.is_set():
        shutil.rmtree(tmp, ignore_errors=True)
        raise TimeoutError(f"{out}: written after its sync had timed out; discarded")
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)


WEIGHTS_FILE = "model.safetensors"


def weights_like(*, state: dict[str, torch.Tensor], like: Path, out: Path) -> bool:
    """Write `state` into `out` as a copy of directory `like` with new weights: the same
    tensor names, shapes, dtypes and file metadata in one `model.safetensors`, every other
    file copied. False (and `out` perhaps half written) where `like` is not one unsharded
    safetensors file whose tensors all appear in `state` with their shapes and dtypes.

    Why: on a small model `save_pretrained` is mostly Python (it serialises the config and
    generation config, splits shards, drops tied duplicates, draws a progress bar): about
    30 ms a version, where writing the same tensors takes 3. The names come from `like`,
    so what save_pretrained left out there (a tied duplicate) stays out."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    source = like / WEIGHTS_FILE
    try:
        files = [p for p in like.iterdir() if p.is_file()]
        if any(p.name.endswith(".index.json") for p in files) or not source.is_file():
            return False
        with safe_open(str(source), framework="pt") as held:
            metadata = held.metadata()
            tensors = {}
            for name in held.keys():
                tensor = state.get(name)
                stored = held.get_slice(name)
                if tensor is None or list(tensor.shape) != list(stored.get_shape()) or \
                        _SAFETENSORS_DTYPES.get(str(tensor.dtype)) != stored.get_dtype():
                    return False
                tensors[name] = tensor.detach().contiguous()
        out.mkdir(parents=True, exist_ok=True)
        for p in files:
            if p.name != WEIGHTS_FILE:
                shutil.copyfile(p, out / p.name)
        save_file(tensors, str(out / WEIGHTS_FILE), metadata=metadata)
    except (OSError, ValueError, RuntimeError):
        # `like` went away or is not what it seemed (a prune, a crash mid-write): save_pretrained.
        return False
    return True


# torch dtype -> the safetensors header's name for it.
_SAFETENSORS_DTYPES = {
    "torch.float32": "F32", "torch.float16": "F16", "torch.bfloat16": "BF16", "torch.float64": "F64",
    "torch.int64": "I64", "torch.int32": "I32", "torch.int16": "I16", "torch.int8": "I8", "torch.uint8": "U8",
    "torch.bool": "BOOL", "torch.float8_e4m3fn": "F8_E4M3", "torch.float8_e5m2": "F8_E5M2",
}


@dataclass(frozen=True)
class Published:
    seconds: float
    # Weight bytes written to storage plus those broadcast (tokenizer files not counted).
    bytes: int


def sync_method(name: str, model: torch.nn.Module | None = None, path: str | None = None) -> str:
    """How a failure names the sync: `adapter` for a LoRA version (its adapter moves, not the
    model), else the sync's own name (checkpoint, memory, nccl)."""
    if (model is not None and is_adapter_model(model)) or (path is not None and is_adapter_dir(path)):
        return "adapter"
    return name


def weight_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).glob("*.safetensors"))


class WeightSync(Protocol):
    name: str

    def publish(self, *, run: RunView, number: int, train_step: int, model: torch.nn.Module,
                tokenizer: PreTrainedTokenizerBase) -> Published:
        """Make version `number` of `run` available to explorers."""
        ...


class CheckpointSync:
    name = "checkpoint"

    def _save(self, *, run: RunView, number: int, model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase
              ) -> tuple[Path, float, int]:
        started = time.perf_counter()
        out, gone = version_dir(run.id, number), threading.Event()
        sync_bounded(lambda: save_pretrained_atomic(model=model, tokenizer=tokenizer, out=out, abandoned=gone,
                                                    like=version_dir(run.id, number - 1) if number > 1 else None),
                     timeout=run.config.sync_timeout_s, method=sync_method(self.name, model), stage="write",
                     run_id=run.id, version=number, where=str(out), abandoned=gone)
        return out, time.perf_counter() - started, weight_bytes(out)

    def _record(self, *, run: RunView, number: int, train_step: int, out: Path, seconds: float, size: int) -> Published:
        from apps.runs.ports import model_version_publish

        model_version_publish(run=run, number=number, checkpoint=str(out), train_step=train_step,
                              seconds=seconds, size=size)
        return Published(seconds=seconds, bytes=size)

    def publish(self, *, run: RunView, number: int, train_step: int, model: torch.nn.Module,
                tokenizer: PreTrainedTokenizerBase) -> Published:
        out, seconds, size = self._save(run=run, number=number, model=model, tokenizer=tokenizer)
        return self._record(run=run, number=number, train_step=train_step, out=out, seconds=seconds, size=size)

    def publish_written(self, *, run: RunView, number: int, train_step: int, write: Callable[[Path], object],
                        tokenizer: PreTrainedTokenizerBase) -> Published:
        """As `publish`, the version's model files made by `write` in a fresh directory
        instead of from a whole model in memory (a learner gang streams its weights there
        from the shards: LearnerGang.version_write); atomic as `save_pretrained_atomic`."""
        started = time.perf_counter()
        out, gone = version_dir(run.id, number), threading.Event()

        def written() -> None:
            tmp = _tmp_for(out)
            tmp.mkdir()
            write(tmp)
            tokenizer.save_pretrained(tmp)
            _replace(tmp, out, gone)

        sync_bounded(written, timeout=run.config.sync_timeout_s, method=self.name, stage="write from the shards",
                     run_id=run.id, version=number, where=str(out), abandoned=gone)
        return self._record(run=run, number=number, train_step=train_step, out=out,
                            seconds=time.perf_counter() - started, size=weight_bytes(out))


@dataclass
class Received:
    """A version's tensors as an explorer received them from the trainer's broadcast."""

    run_id: int
    version: int
    path: str
    tensors: dict[str, torch.Tensor]
    bytes: int
    seconds: float


# The addresses of this process's broken NcclSync groups (NcclSync.broken).
_BROKEN_GROUPS: set[str] = set()


class NcclSync(CheckpointSync):
    """Checkpoint plus a broadcast of the tensors from the trainer (rank 0) to explorer ranks.

    The group is joined once per process (`init_process_group`, a TCP rendezvous at
    `RFT_NCCL_ADDR`, world size `RFT_NCCL_WORLD`, this process's `RFT_NCCL_RANK`; the
    trainer is rank 0). Backend `nccl` on GPU hosts; `gloo` runs the same protocol on CPUs
    (how it is tested here). What goes over the wire: a header (run, version, checkpoint
    path, each tensor's name, shape and dtype, as JSON), then the tensors in that order. A
    LoRA policy sends its adapter only. Explorers run a `SyncReceiver` thread that takes
    each broadcast and keeps it; `workers.engines.engine_version_ensure` applies kept
    tensors to a transformers engine instead of reading the checkpoint, and any engine that
    cannot take them (vLLM, a layout that does not match) loads the checkpoint as before:
    the files are always written first, so a late or restarted explorer loses nothing.
    """

    name = "nccl"

    def __init__(
        self, *, addr: str | None = None, world_size: int | None = None, rank: int | None = None, backend: str = "nccl"
    ) -> None:
        import torch

        if backend == "nccl" and not torch.cuda.is_available():
            raise SyncUnavailable("NCCL weight sync needs CUDA on this host; use RFT_WEIGHT_SYNC=checkpoint")
        self.backend = backend
        self.device = "cuda" if backend == "nccl" else "cpu"
        self.addr = addr or _settings().RFT_NCCL_ADDR
        self.world_size = world_size or _settings().RFT_NCCL_WORLD
        self.rank = _settings().RFT_NCCL_RANK if rank is None else rank
        self._group: dist.ProcessGroup | None = None

    @property
    def broken(self) -> bool:
        """A broadcast over this process's group failed or timed out: the ranks no longer
        agree on the order of what is sent, so nothing more goes over it (versions go by
        checkpoint only). Per process, not per object: `weight_sync_for` makes one a publish."""
        return self.addr in _BROKEN_GROUPS

    @broken.setter
    def broken(self, value: bool) -> None:
        if value:
            _BROKEN_GROUPS.add(self.addr)
        else:
            _BROKEN_GROUPS.discard(self.addr)

    def _group_get(self) -> dist.ProcessGroup:
        import torch.distributed as dist

        if self._group is None:
            if not dist.is_initialized():
                dist.init_process_group(self.backend, init_method=self.addr, world_size=self.world_size, rank=self.rank)
            self._group = dist.group.WORLD
        return self._group

    @staticmethod
    def sync_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
        """What a version is: the adapter's tensors for a LoRA policy, else every tensor."""
        if is_adapter_model(model):
            from peft import get_peft_model_state_dict

            return dict(get_peft_model_state_dict(model))
        return dict(model.state_dict())

    def _broadcast_one(self, tensor: torch.Tensor, timeout: float | None) -> None:
        """One broadcast from rank 0, waited for at most `timeout` seconds (None: the group's
        own timeout, as an explorer waits for the next version). A wait that fails leaves the
        group's order of collectives unknown: it is `broken` from then on."""
        import datetime

        import torch.distributed as dist

        try:
            work = dist.broadcast(tensor, src=0, group=self._group_get(), async_op=True)
            assert work is not None  # async_op
            if timeout is None:
                work.wait()
            else:
                work.wait(timeout=datetime.timedelta(seconds=timeout))
        except BaseException:
            self.broken = True
            raise

    def _bytes_broadcast(self, data: bytes | None, timeout: float | None = None) -> bytes:
        import torch

        size = torch.tensor([len(data) if data is not None else 0], dtype=torch.int64, device=self.device)
        self._broadcast_one(size, timeout)
        buf = (torch.frombuffer(bytearray(data), dtype=torch.uint8).to(self.device) if data is not None
               else torch.empty(int(size.item()), dtype=torch.uint8, device=self.device))
        self._broadcast_one(buf, timeout)
        return bytes(buf.cpu().numpy().tobytes())

    def where(self) -> str:
        return f"{self.backend} group {self.addr} (rank {self.rank} of {self.world_size})"

    def broadcast(self, model: torch.nn.Module, *, run_id: int = 0, version: int = 0, path: str = "",
                  timeout: float = 600.0) -> int:
        """Rank 0: send the version's tensors, each within `timeout` seconds (the run's
        sync_timeout_s, which the header passes on to the receivers); returns the bytes sent.
        SyncFailed when a receiver does not take them in time, or the group broke before."""
        import json

        started = time.monotonic()
        method = sync_method(self.name, model)
        if self.broken:
            raise SyncFailed(method=method, stage="broadcast", run_id=run_id, version=version, where=self.where(),
                             worker=process_name(), seconds=0.0,
                             cause="the group broke on an earlier failure; explorers load the checkpoint")
        tensors = sorted(self.sync_tensors(model).items())
        header = {"run": run_id, "version": version, "path": path, "timeout": timeout,
                  "tensors": [[name, list(t.shape), str(t.dtype).removeprefix("torch.")] for name, t in tensors]}
        sent = 0
        try:
            self._bytes_broadcast(json.dumps(header).encode(), timeout)
            for _, tensor in tensors:
                t = tensor.detach().to(self.device).contiguous()
                self._broadcast_one(t, timeout)
                sent += t.numel() * t.element_size()
        except Exception as exc:
            raise SyncFailed(method=method, stage="broadcast", run_id=run_id, version=version, where=self.where(),
                             worker=process_name(), seconds=time.monotonic() - started,
                             cause=f"{type(exc).__name__}: {exc} (sync_timeout_s {timeout:g} s)") from exc
        return sent

    def receive(self) -> Received:
        """An explorer rank: take the next broadcast whole. Waits for a version's header as
        long as the group lets it; its tensors then within the header's timeout, else
        SyncFailed."""
        import json

        import torch

        header = json.loads(self._bytes_broadcast(None))
        started = time.perf_counter()
        tensors: dict[str, torch.Tensor] = {}
        size = 0
        timeout = float(header.get("timeout", 600.0))
        try:
            for name, shape, dtype in header["tensors"]:
                buf = torch.empty(shape, dtype=getattr(torch, dtype), device=self.device)
                self._broadcast_one(buf, timeout)
                tensors[name] = buf.cpu()
                size += buf.numel() * buf.element_size()
        except Exception as exc:
            raise SyncFailed(method=sync_method(self.name, path=str(header["path"])), stage="receive",
                             run_id=int(header["run"]), version=int(header["version"]), where=self.where(),
                             worker=process_name(), seconds=time.perf_counter() - started,
                             cause=f"{type(exc).__name__}: {exc} (sync_timeout_s {timeout:g} s)") from exc
        return Received(run_id=int(header["run"]), version=int(header["version"]), path=str(header["path"]),
                        tensors=tensors, bytes=size, seconds=time.perf_counter() - started)

    def publish(self, *, run: RunView, number: int, train_step: int, model: torch.nn.Module,
                tokenizer: PreTrainedTokenizerBase) -> Published:
        """The checkpoint, then the broadcast (skipped once the group broke: explorers load
        the files, written first); a broadcast that fails raises SyncFailed before the
        version is recorded, and the step's re-dispatch publishes it from the files."""
        out, seconds, size = self._save(run=run, number=number, model=model, tokenizer=tokenizer)
        if self.world_size > 1 and not self.broken:
            started = time.perf_counter()
            size += self.broadcast(model, run_id=run.id, version=number, path=str(out), timeout=run.config.sync_timeout_s)
            seconds += time.perf_counter() - started
        return self._record(run=run, number=number, train_step=train_step, out=out, seconds=seconds, size=size)


class SyncReceiver:
    """An explorer's side of `NcclSync`: a daemon thread that receives every broadcast and
    keeps the newest per checkpoint path until an engine takes it (`take`)."""

    def __init__(self, sync: NcclSync, *, limit: int | None = None) -> None:
        import threading

        self.sync = sync
        # Stop after this many versions (tests; None: for the life of the process).
        self.limit = limit
        self._lock = threading.Lock()
        self._kept: dict[str, Received] = {}
        self.received = 0
        # The SyncFailed it stopped on, until `failure_take` hands it to be recorded.
        self.failure: SyncFailed | None = None
        self._thread = threading.Thread(target=self._loop, name="weight-sync-receiver", daemon=True)

    def start(self) -> SyncReceiver:
        self._thread.start()
        return self

    def _loop(self) -> None:
        import logging

        while self.limit is None or self.received < self.limit:
            try:
                got = self.sync.receive()
            except SyncFailed as exc:
                # For the run's timeline: the explorer notes it (workers.explore.explorer.engine_at).
                self.failure = exc
                logging.getLogger(__name__).exception("weight sync receiver stopped; explorers load checkpoints")
                return
            except Exception:
                logging.getLogger(__name__).exception("weight sync receiver stopped; explorers load checkpoints")
                return
            self.keep(got)

    def keep(self, got: Received) -> None:
        with self._lock:
            # Older versions of the same run are of no use once a newer one is here.
            for path, old in list(self._kept.items()):
                if old.run_id == got.run_id and old.version < got.version:
                    del self._kept[path]
            self._kept[os.path.realpath(got.path)] = got
            self.received += 1

    def failure_take(self) -> SyncFailed | None:
        with self._lock:
            failure, self.failure = self.failure, None
        return failure

    def take(self, path: str) -> Received | None:
        with self._lock:
            return self._kept.pop(os.path.realpath(path), None)


_RECEIVER: SyncReceiver | None = None


def receiver_install(receiver: SyncReceiver | None) -> None:
    """Make `receiver` the one `engine_version_ensure` consults in this process."""
    global _RECEIVER
    _RECEIVER = receiver


def receiver_ensure() -> SyncReceiver | None:
    """On an explorer rank of an `nccl` deployment (RFT_NCCL_RANK ≥ 1), start receiving
    broadcasts (once per process); elsewhere nothing."""
    global _RECEIVER
    if _settings().RFT_WEIGHT_SYNC != "nccl" or _settings().RFT_NCCL_RANK < 1:
        return None
    if _RECEIVER is None:
        _RECEIVER = SyncReceiver(NcclSync()).start()
    return _RECEIVER


def receiver_failure_take() -> SyncFailed | None:
    """The failure this process's receiver stopped on, once (None: none, or no receiver)."""
    return _RECEIVER.failure_take() if _RECEIVER is not None else None


def received_take(path: str) -> Received | None:
    """The broadcast tensors of the version saved at `path`, if this process received them."""
    return _RECEIVER.take(path) if _RECEIVER is not None else None


def weight_sync_for(name: str | None = None) -> WeightSync:
    name = name or _settings().RFT_WEIGHT_SYNC
    if name == "checkpoint":
        return CheckpointSync()
    if name == "nccl":
        return NcclSync()
    raise ValueError(f"unknown weight sync {name!r}; use checkpoint or nccl")
