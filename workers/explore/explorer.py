"""The explorer: tasks in, scored experiences out, streamed live.

`explore_step(run_id, step)` claims a batch of task attempts, samples `repeat_times`
completions per task with the model version the run's policy asks for, scores them with
the run's inline rule rewards (terms that need the `reward` queue are handed over), writes
one experience per completion through `experience_write` and announces each one.

Idempotence: an experience's key is `explore:<attempt id>:<sample index>`. An attempt keeps
its id when its lease expires or the task is retried, so whatever happens the buffer holds
each (attempt, sample) once. Nothing is written for a run that is not running.

Rollout workers run `celery worker -P solo` (or threads): a resident engine must live in
the worker's main process, and vLLM spawns processes, which prefork's daemonic children cannot.
Both tasks run on the `rollout` queue (rftweb.celery routes `workers.explore.explorer.*` there), as does
the OpenAI-style `workers.explore.chat.chat`, whose module is workers/explore/chat.py.
Importing this module is cheap (no torch: the engines package, the handover and vision
modules load torch only inside their functions), so the web side can send these tasks by
name without loading any model code.
"""

from __future__ import annotations

import gc
import logging
import math
import os
import socket
import statistics
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, TypedDict

from celery import Task, signals
from celery.exceptions import SoftTimeLimitExceeded
from django.db import OperationalError

from apps.buffer.ports import EXPLORER, ExperienceDraft, TaskSource, tasks_exhausted
from apps.control.ports import dispatch_begin, explore_step_write, run_advance_after_step
from apps.rewards.ports import rewards_awaiting, rewards_inline
from apps.runs.ports import (
    RUNNING,
    DispatchJob,
    RunView,
    explore_version,
    metric_record,
    run_explore_end,
    run_explored,
    run_status,
    run_view,
    version_checkpoint,
    version_published_age,
    weight_load_record,
)
from kernel.exceptions import InvalidInput, Unavailable
from kernel.jsontypes import JSONObject
from rftweb.taskkit import celery_bound_task, celery_task, on_signal
from workers.engines import (
    SamplingSpec,
    engine_cache_close,
    engine_cache_drop,
    engine_cached,
    engine_for,
    engine_last_load,
    engine_version_ensure,
    prompt_ids,
)
from workers.weights.handover import handover_apply, handover_has, sync_failure_note
from workers.weights.sync import SyncFailed, receiver_failure_take, sync_bounded, sync_method
from workers.vision import images_open, stored_ids, vision_prompt

if TYPE_CHECKING:
    from apps.buffer.ports import TaskAttempt
    from workers.engines.base import Prompt, RolloutEngine, Sample
    from workers.vision import ImagePrompt

log = logging.getLogger(__name__)


@on_signal(signals.worker_shutdown)
def _engines_end_with_the_worker(**_: object) -> None:
    # After a warm shutdown's last task: left to the interpreter's exit, a vLLM engine's
    # teardown outlasted the stop's grace (VLLMEngine.close says why).
    engine_cache_close()
    # The process is on its way out: its last garbage collection would walk the heap that
    # torch, transformers and vLLM built, to free what the process's end frees anyway (frozen
    # objects are skipped). Every worker of this project gets here (its task discovery imports
    # this module, rftweb/celery.py): SIGTERM to exit 7.3 and 6.8 s -> 1.5 and 1.3 s for one
    # that had loaded a transformers engine (load 5-7); 11 s of a vLLM rollout worker's 12 s
    # exit. It lives here, not in workers.engines, which the GPU check imports without Celery.
    gc.freeze()


class PromptTask(Protocol):
    """What the explorer reads of a task to prompt the model (apps.buffer's tasks have it)."""

    @property
    def pk(self) -> int: ...
    @property
    def prompt(self) -> str: ...
    # Chat messages instead of a text prompt: [{"role": …, "content": …}].
    @property
    def messages(self) -> list[dict[str, str]] | None: ...
    # The digests of the prompt's pictures (apps/buffer/images.py).
    @property
    def images(self) -> list[str]: ...


class ExploreOutcome(TypedDict, total=False):
    """What an explore step returns: what it did, or why it skipped."""

    run: int
    step: int
    skipped: str
    tasks: int
    experiences: int
    duplicates: int
    model_version: int
    # Every epoch of the taskset is explored.
    exhausted: bool


class Completion(TypedDict):
    """One completion of a free-form generate request (the environment API's answer)."""

    # The index of its request, and its own among the request's n.
    request: int
    index: int
    text: str
    token_ids: list[int]
    prompt_token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    model_version: int

class VersionNotReady(Unavailable):
    """The version this step needs is not published yet; the task retries shortly."""

    code = "version_not_ready"


def worker_name() -> str:
    return f"explorer@{socket.gethostname()}:{os.getpid()}"


def explorer_version_for(*, run: RunView, step: int) -> int:
    """The model version explore step `step` must use, from the run's mode (apps/runs/schedule.py);
    VersionNotReady makes the step wait for the trainer."""
    version = explore_version(cfg=run.config, explore_step=step, current_version=run.current_version)
    if version is None:
        raise VersionNotReady(f"run {run.id} explore step {step} waits for the trainer (current v{run.current_version})")
    return version


# (run id, version) -> checkpoint, as read from ModelVersion: a published version's row is
# never changed (apps/runs/services.py inserts it once), so a chat call at a version this
# process has seen costs no query. Bounded: cleared whole when full.
_CHECKPOINTS: dict[tuple[int, int], str] = {}
_CHECKPOINTS_MAX = 4096


def checkpoint_known(*, run_id: int, version: int) -> str | None:
    """The checkpoint of a version this process has already read, without asking the database."""
    return _CHECKPOINTS.get((run_id, version))


def model_version_path(*, run: RunView, version: int) -> str:
    """Where version `version` of the run lives: the base model for 0, else its checkpoint."""
    if version == 0:
        return str(run.config.model)
    checkpoint = _CHECKPOINTS.get((run.id, version))
    if checkpoint is None:
        checkpoint = version_checkpoint(run_id=run.id, number=version)
        if checkpoint is None:
            raise VersionNotReady(f"run {run.id} has no published version {version}")
        if len(_CHECKPOINTS) >= _CHECKPOINTS_MAX:
            _CHECKPOINTS.clear()
        _CHECKPOINTS[(run.id, version)] = checkpoint
    if not handover_has(checkpoint) and not os.path.exists(checkpoint):
        # MemorySync records a version before its files are written (workers/weights/handover.py);
        # past the run's bound a missing directory is a failed sync (storage not shared with
        # the trainer's host, a write lost), not a version to wait for forever.
        age = version_published_age(run_id=run.id, number=version)
        if age is not None and age > run.config.sync_timeout_s:
            raise SyncFailed(method=sync_method("checkpoint"), stage="find the checkpoint", run_id=run.id,
                             version=version, where=checkpoint, worker=worker_name(), seconds=age,
                             cause=f"not on this host's disk {age:.0f} s after it was published (the run's "
                                   f"sync_timeout_s is {run.config.sync_timeout_s:g} s); is RFT_STORAGE_DIR "
                                   "shared with the trainer's host?")
        raise VersionNotReady(f"run {run.id} version {version}: {checkpoint} is not written yet")
    return checkpoint


def engine_at(*, run: RunView, version: int, worker: str) -> RolloutEngine:
    """The resident engine holding `version` of the run; records the load when one happens.
    A sync that fails or runs past the run's `sync_timeout_s` raises SyncFailed, recorded on
    the run's weight-sync timeline first."""
    stopped = receiver_failure_take()
    if stopped is not None:  # this process's NCCL receiver failed mid-version since
        sync_failure_note(stopped)
    try:
        return _engine_at(run=run, version=version, worker=worker)
    except SyncFailed as exc:
        sync_failure_note(exc)
        raise


def _engine_at(*, run: RunView, version: int, worker: str) -> RolloutEngine:
    path = model_version_path(run=run, version=version)
    started = time.monotonic()
    resident = engine_cached(run.config)
    engine = engine_for(run.config)
    current = engine.version == version and getattr(engine, "path", None) == path
    timeout = run.config.sync_timeout_s
    try:
        loaded = not current and handover_apply(engine, version=version, path=path, run_id=run.id, timeout=timeout)
        # A version's load is bounded (a read stalled on lost storage); the base model's is
        # an engine's start, not a sync.
        ensured = not loaded and (
            sync_bounded(lambda: engine_version_ensure(engine, version=version, path=path), timeout=timeout,
                         method=sync_method("checkpoint", path=path), stage="load", run_id=run.id, version=version,
                         where=path, worker=worker)
            if version > 0 else engine_version_ensure(engine, version=version, path=path))
    except SyncFailed:
        # Half loaded, or still loading in the thread left behind: the next step builds it afresh.
        engine_cache_drop(run.config)
        raise
    if loaded or ensured or not resident:
        how = engine_last_load(engine) if ensured else None
        weight_load_record(run=run, version=version, worker=worker, seconds=time.monotonic() - started,
                           size=how.bytes if how else None, via=how.via if how else ("memory" if loaded else None))
    return engine


def explore_seed(*, seed: int, step: int) -> int:
    """The sampling seed of explore step `step` of a run seeded `seed` (distinct per step)."""
    return (int(seed) * 1_000_003 + int(step)) % (2**31 - 1)


def _prompt_of(task: PromptTask) -> tuple[str | None, list[dict[str, str]] | None]:
    if task.messages:
        return None, list(task.messages)
    return task.prompt, None


def _display_prompt(task: PromptTask) -> str:
    if task.messages:
        users = [m["content"] for m in task.messages if m.get("role") == "user"]
        return users[-1] if users else task.messages[-1]["content"]
    return task.prompt


def task_prompt(engine: RolloutEngine, task: PromptTask) -> Prompt:
    """A task's prompt for `engine`: token ids, or with the task's pictures an ImagePrompt."""
    text, messages = _prompt_of(task)
    if task.images:
        return _image_prompt(engine, task=task, text=text, messages=messages)
    return prompt_ids(engine.tokenizer, text=text, messages=messages)


def _image_prompt(engine: RolloutEngine, *, task: PromptTask, text: str | None,
                  messages: list[dict[str, str]] | None) -> ImagePrompt:
    """A task's prompt with its pictures (workers/vision.py): the engine's model must see images."""
    processor = getattr(engine, "processor", None)
    if processor is None:
        raise InvalidInput(f"task {task.pk} has images but the run's model {getattr(engine, 'path', '')} "
                           "is not a vision-language model", field="model")
    return vision_prompt(processor, text=text, messages=messages, images=images_open(task.images), digests=task.images)


def _skipped(run_id: int, step: int, why: str) -> ExploreOutcome:
    return {"run": run_id, "step": step, "skipped": why}


@dataclass
class HeldTasks:
    """The task attempts an explore step holds under lease; `written` once its write took them."""

    attempts: list[TaskAttempt]
    written: bool = False

    @property
    def ids(self) -> list[int]:
        return [a.pk for a in self.attempts]


def _claim(*, run: RunView, worker: str) -> list[TaskAttempt]:
    # Leases this worker still holds on the run's tasks are an earlier try's that could not
    # hand them back (the database went away mid-step, so the release failed too): it holds
    # the run's one explore dispatch now, so they are nobody else's. Handed back before the
    # claim, not only when the claim finds nothing: with other tasks queued the claim took
    # those, and the stale leases held the run's end until they ran out (RFT_LEASE_SECONDS,
    # 300 s; tests/test_faults.py timed out on it once in CI).
    TaskSource.release(run=run, worker=worker)
    return TaskSource.claim(run=run, worker=worker, size=run.config.explore_batch_size)


@contextmanager
def tasks_held(*, run: RunView, worker: str) -> Iterator[HeldTasks]:
    """Claim a batch of the run's task attempts and hand back on the way out whatever the step
    did not write, on every path (an exception at any stage, a skip, tasks lost meanwhile):
    at once, rather than when the lease runs out."""
    held = HeldTasks(_claim(run=run, worker=worker))
    try:
        yield held
    finally:
        if held.attempts and not held.written:
            TaskSource.release(run=run, worker=worker, ids=held.ids)


@dataclass(frozen=True)
class Generated:
    """An explore step's completions: `samples[i]` are the n of `prompts[i]`."""

    prompts: list[Prompt]
    samples: list[list[Sample]]
    seconds: float


@dataclass
class Scored:
    """An explore step's experiences, ready to write, and the figures its metrics need."""

    drafts: list[ExperienceDraft] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)


def _sampling(run: RunView, engine: RolloutEngine, step: int) -> SamplingSpec:
    sampling = SamplingSpec.from_config(run.config.sampling)
    if sampling.seed is None and engine.backend == "transformers":
        # The transformers engine draws from the process's global RNG, whose state depends
        # on what the process did before (other runs, the trainer beside it in one process,
        # step 1 coming before the trainer seeds anything): seeded per step from the run's
        # seed, a rerun samples the same completions. vLLM seeds its own engine.
        sampling = sampling.with_overrides({"seed": explore_seed(seed=run.config.seed, step=step)})
    return sampling


def _generate(*, run: RunView, engine: RolloutEngine, step: int, attempts: Sequence[TaskAttempt]) -> Generated:
    prompts = [task_prompt(engine, attempt.task) for attempt in attempts]
    sampling = _sampling(run, engine, step)
    started = time.monotonic()
    samples = engine.generate(prompts, n=run.config.repeat_times, sampling=sampling)
    return Generated(prompts=prompts, samples=samples, seconds=time.monotonic() - started)


def _draft(*, run: RunView, step: int, version: int, attempt: TaskAttempt, prompt: Prompt, index: int,
           sample: Sample, scored: Scored, awaiting: list[str]) -> ExperienceDraft:
    task = attempt.task
    result = rewards_inline(terms=run.config.rewards, completion=sample.text, task=task)
    scored.scores.append(result.score)
    scored.lengths.append(len(sample.token_ids))
    metadata: dict[str, object] = {"step": step, "epoch": attempt.epoch, "attempt": attempt.pk, "sample": index}
    if task.images:
        # The pictures the model saw, by digest (the trainer and the pages fetch them).
        metadata["images"] = list(task.images)
    if awaiting:
        # The total waits for the queued scorers; they fill it in and flip the status.
        metadata["awaiting_rewards"] = awaiting
    return ExperienceDraft.scored(
        cfg=run.config,
        auto_reward=None if awaiting else result.score,
        run_id=run.id,
        task_id=task.pk,
        group_id=f"attempt-{attempt.pk}",
        key=f"explore:{attempt.pk}:{index}",
        source=EXPLORER,
        prompt_text=_display_prompt(task),
        messages=task.messages,
        response_text=sample.text,
        token_ids=stored_ids(prompt) + list(sample.token_ids),
        prompt_length=len(stored_ids(prompt)),
        logprobs=list(sample.logprobs),
        finish_reason=sample.finish_reason,
        reward_parts=result.parts,
        model_version=version,
        metadata=metadata,
    )


def _score(*, run: RunView, step: int, version: int, attempts: Sequence[TaskAttempt], generated: Generated) -> Scored:
    scored = Scored()
    for attempt, prompt, group in zip(attempts, generated.prompts, generated.samples):
        # Keys, not names: a term repeated in the spec is awaited as "name#2", the key the
        # reward worker scores it under.
        awaiting = rewards_awaiting(terms=run.config.rewards, task=attempt.task)
        for i, sample in enumerate(group):
            scored.drafts.append(_draft(run=run, step=step, version=version, attempt=attempt, prompt=prompt,
                                        index=i, sample=sample, scored=scored, awaiting=awaiting))
    return scored


def _record(*, run: RunView, step: int, version: int, scored: Scored, generated: Generated, started: float) -> None:
    seconds = generated.seconds
    metric_record(
        run=run,
        step=step,
        values={
            "explore/reward_mean": statistics.fmean(scored.scores),
            "explore/reward_std": statistics.pstdev(scored.scores),
            "explore/response_length": statistics.fmean(scored.lengths),
            "explore/tokens_per_second": sum(scored.lengths) / seconds if seconds > 0 else math.nan,
            "explore/model_version": float(version),
            "explore/generate_seconds": seconds,
            "explore/step_seconds": time.monotonic() - started,
        },
    )


def _nothing_to_explore(*, run: RunView, step: int, version: int) -> ExploreOutcome:
    outcome: ExploreOutcome = {"run": run.id, "step": step, "tasks": 0, "experiences": 0, "model_version": version}
    if tasks_exhausted(run=run):
        # Every epoch is explored: exploring ends here rather than stalling the run, and
        # the trainer gets to train on what the buffer holds and finish.
        if run_explore_end(run=run):
            log.info("run %s: the taskset's %s epoch(s) are explored; exploring ends at step %s", run.id, run.config.epochs, step)
        outcome["exhausted"] = True
    return outcome


def explore(*, run_id: int, step: int, worker: str | None = None) -> ExploreOutcome:
    """One explore step of a run (the logic of the `explore_step` task): claim -> generate ->
    score -> write -> record; `tasks_held` hands the claimed tasks back on every path that
    does not write them."""
    started = time.monotonic()
    worker = worker or worker_name()
    run = run_view(run_id)
    if run is None or not run.running:
        return _skipped(run_id, step, "no such run" if run is None else f"run is {run.status}")
    version = explorer_version_for(run=run, step=step)
    engine = engine_at(run=run, version=version, worker=worker)
    with tasks_held(run=run, worker=worker) as held:
        if not held.attempts:
            return _nothing_to_explore(run=run, step=step, version=version)
        generated = _generate(run=run, engine=engine, step=step, attempts=held.attempts)
        if run_status(run_id) != RUNNING:
            # Paused or stopped while generating: the run gets nothing more from this step.
            return _skipped(run_id, step, "run left running during the step")
        scored = _score(run=run, step=step, version=version, attempts=held.attempts, generated=generated)
        written = explore_step_write(run=run, step=step, worker=worker, drafts=scored.drafts, attempt_ids=held.ids,
                                     model_version=version)
        if written is None:
            # Its tasks were handed back while it generated: nothing written, the step goes again.
            log.warning("run %s: explore step %s lost its tasks while generating; nothing written", run_id, step)
            return _skipped(run_id, step, "its tasks were handed back while it generated")
        held.written = True
    _record(run=run, step=step, version=version, scored=scored, generated=generated, started=started)
    return {"run": run_id, "step": step, "tasks": len(held.attempts), "experiences": written.created,
            "duplicates": written.duplicates, "model_version": version}


# A step is idempotent (same attempt, same keys), so a redelivery or a retry after a lost
# database connection is safe; it runs only while the run's explore dispatch names it (or
# nothing is out), and hands the dispatch back when it ends, whatever the outcome. Retries:
# database hiccups 3 times with backoff. A version not yet published ends the task: the
# loop sends the step again once the policy lets it go. Time limits leave the soft one room
# to hand the claimed tasks back.
@celery_bound_task(
    name="workers.explore.explorer.explore_step",
    acks_late=True,
    reject_on_worker_lost=True,
    soft_time_limit=1500,
    time_limit=1800,
    autoretry_for=(OperationalError,),
    retry_backoff=True,
    max_retries=3,
)
def explore_step(self: Task, run_id: int, step: int) -> ExploreOutcome:
    holder = worker_name()
    hold = dispatch_begin(run_id=run_id, job=DispatchJob.EXPLORE, step=step, task_id=self.request.id,
                          worker=self.request.hostname or holder, holder=holder)
    if hold is None:
        return {"run": run_id, "step": step, "skipped": "another dispatch has the run's explore step"}
    result: ExploreOutcome
    try:
        if run_explored(run_id, step):
            # A copy sent again for a worker that died after its step committed: done.
            result = {"run": run_id, "step": step, "skipped": "explored already"}
        else:
            result = explore(run_id=run_id, step=step, worker=holder)
    except VersionNotReady as exc:
        result = {"run": run_id, "step": step, "skipped": str(exc)}
    except SoftTimeLimitExceeded:
        log.warning("explore_step run %s step %s hit its soft time limit; tasks handed back", run_id, step)
        raise
    finally:
        hold.end()
    run = run_view(run_id)
    if run is not None and (not result.get("skipped") or result.get("exhausted")):
        run_advance_after_step(run=run)
    return result


class GenerateRequestInvalid(InvalidInput):
    """A generate request is malformed; the message names the request and the field."""

    code = "generate_request_invalid"


_SAMPLING_KEYS = ("temperature", "top_p", "top_k", "max_tokens", "stop", "seed")


def _request_parts(index: int, request: object, base: SamplingSpec
                   ) -> tuple[str | None, list[dict[str, str]] | None, int, SamplingSpec]:
    where = f"request {index}"
    if not isinstance(request, Mapping):
        raise GenerateRequestInvalid(f"{where}: expected an object")
    text, messages = request.get("prompt"), request.get("messages")
    if (text is None) == (messages is None):
        raise GenerateRequestInvalid(f"{where}: give exactly one of prompt or messages")
    if text is not None and not isinstance(text, str):
        raise GenerateRequestInvalid(f"{where}: prompt must be text")
    if messages is not None and not (
        isinstance(messages, list)
        and messages
        and all(isinstance(m, Mapping) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in messages)
    ):
        raise GenerateRequestInvalid(f"{where}: messages must be a non-empty list of {{role, content}} objects")
    n = request.get("n", 1)
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= 256:
        raise GenerateRequestInvalid(f"{where}: n must be an integer from 1 to 256")
    overrides = dict(request.get("sampling") or {})
    overrides.update({k: request[k] for k in _SAMPLING_KEYS if k in request})
    try:
        sampling = base.with_overrides(overrides)
    except (TypeError, ValueError) as exc:
        raise GenerateRequestInvalid(f"{where}: {exc}") from None
    return text, messages, n, sampling


def generate_completions(*, run_id: int, requests: Sequence[object]) -> list[Completion]:
    """Completions for free-form requests (the environment API) with the run's current
    version. One dict per completion, in request order; `request` is its request's index."""
    run = run_view(run_id)
    if run is None:
        raise GenerateRequestInvalid(f"no run {run_id}")
    if not isinstance(requests, list) or not requests:
        raise GenerateRequestInvalid("requests must be a non-empty list")
    base = SamplingSpec.from_config(run.config.sampling)
    parsed = [_request_parts(i, r, base) for i, r in enumerate(requests)]
    version = run.current_version
    engine = engine_at(run=run, version=version, worker=worker_name())
    ids = [prompt_ids(engine.tokenizer, text=text, messages=messages) for text, messages, _, _ in parsed]
    # One engine call per distinct (n, sampling): vLLM batches the prompts of each.
    batches: dict[tuple[int, SamplingSpec], list[int]] = {}
    for i, (_, _, n, sampling) in enumerate(parsed):
        batches.setdefault((n, sampling), []).append(i)
    results: dict[int, list[Sample]] = {}
    for (n, sampling), members in batches.items():
        for i, samples in zip(members, engine.generate([ids[i] for i in members], n=n, sampling=sampling)):
            results[i] = samples
    return [
        {
            "request": i,
            "index": j,
            "text": sample.text,
            "token_ids": list(sample.token_ids),
            "prompt_token_ids": list(ids[i]),
            "logprobs": list(sample.logprobs),
            "finish_reason": sample.finish_reason,
            "model_version": version,
        }
        for i in range(len(parsed))
        for j, sample in enumerate(results[i])
    ]


# Reads only, so safe to run twice; the caller (an API request) waits for it and decides
# about retrying, hence no automatic retry. Bad requests raise GenerateRequestInvalid.
@celery_task(
    name="workers.explore.explorer.generate",
    acks_late=True,
    soft_time_limit=300,
    time_limit=330,
)
def generate(run_id: int, requests: list[JSONObject]) -> list[Completion]:
    return generate_completions(run_id=run_id, requests=requests)
