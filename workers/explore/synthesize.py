"""Worker-side synthesis: paraphrases of tasks through the rollout engine.

The import pipeline's `synth_paraphrase` step enqueues `taskset_paraphrase` (queue
`rollout`, where the engine and its model live). It asks the engine for paraphrases of
the taskset's tasks, keeps those that pass `paraphrase_accept` (not empty, not the
original, every number kept so the reference answer stays right) and stores them as new
synthetic tasks of the same taskset, each pointing at its source task.

The engine is the worker's resident rollout engine from `workers.engines` (transformers
by default; `params.engine: vllm` on GPU hosts).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, TypedDict

from apps.buffer.ports import paraphrase_accept, paraphrase_sources, paraphrases_add
from apps.runs.ports import metric_record, run_view
from rftweb.taskkit import celery_task
from workers.engines import engine_for, EngineWanted
from workers.engines.base import SamplingSpec

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from workers.engines.base import RolloutEngine, SamplingSpec

log = logging.getLogger(__name__)


class ParaphraseParams(TypedDict, total=False):
    """`taskset_paraphrase`'s params: apps/buffer/pipeline/synthesize.py's ParaphraseParams
    as the pipeline sends them (dumped, the model filled in), and the engine to use."""

    model: str | None
    engine: str
    n: int
    max_tasks: int | None
    instruction: str
    max_tokens: int
    temperature: float
    require_numbers: bool
    seed: int


def Sampling(*, temperature: float = 0.8, max_tokens: int = 128, seed: int | None = 0) -> SamplingSpec:
    """Sampling for paraphrases: the engines' SamplingSpec with paraphrase defaults."""

    return SamplingSpec(temperature=temperature, max_tokens=max_tokens, seed=seed)


def _engine_for(model: str, *, backend: str = "transformers") -> tuple[RolloutEngine, PreTrainedTokenizerBase]:
    """(engine, tokenizer) for `model`: the worker's resident rollout engine (workers.engines)."""

    engine = engine_for(EngineWanted(engine=backend, model=model))
    return engine, engine.tokenizer


def tasks_paraphrase(
    *, taskset_id: int, engine: RolloutEngine, tokenizer: PreTrainedTokenizerBase, n: int = 1,
    sampling: SamplingSpec | None = None,
    instruction: str = "{prompt}", require_numbers: bool = True, max_tasks: int | None = None,
) -> dict[str, int]:
    """Paraphrase the taskset's unfiltered, non-synthetic text tasks; store the accepted
    ones as synthetic tasks. Idempotent: tasks already paraphrased are skipped."""

    sampling = sampling or Sampling()
    sources = paraphrase_sources(taskset_id=taskset_id, limit=max_tasks)
    counts = {"asked": 0, "accepted": 0}
    if not sources:
        return counts
    prompts = [tokenizer.encode(instruction.format(prompt=t.prompt), add_special_tokens=False) for t in sources]
    results = engine.generate(prompts, n=n, sampling=sampling)
    new = []
    for task, per_prompt in zip(sources, results):
        seen: set[str] = set()
        for sample in per_prompt:  # the engine's Samples, their text decoded
            counts["asked"] += 1
            text = sample.text.strip()
            why = paraphrase_accept(task.prompt, text, require_numbers=require_numbers)
            if why is None and text in seen:
                why = "repeated"
            if why is not None:
                counts[f"rejected_{why}"] = counts.get(f"rejected_{why}", 0) + 1
                continue
            seen.add(text)
            new.append((task, text))
    counts["accepted"] = paraphrases_add(taskset_id=taskset_id, paraphrases=new)
    return counts


def _counts_record(run_id: int | None, counts: dict[str, int]) -> None:
    if run_id is None:
        return

    run = run_view(run_id)
    if run is not None:
        metric_record(run=run, step=run.explore_step,
                      values={f"pipeline/import/synth_paraphrase/{k}": float(v) for k, v in counts.items()})


# Idempotent (tasks already paraphrased are skipped); retried a few times when the engine
# fails to start; a time limit because a stuck generation must not hold the GPU forever.
@celery_task(
    name="workers.explore.synthesize.taskset_paraphrase", acks_late=True, autoretry_for=(OSError,),
    max_retries=3, retry_backoff=True, time_limit=1800, soft_time_limit=1700,
)
def taskset_paraphrase(*, taskset_id: int, params: ParaphraseParams, run_id: int | None = None) -> dict[str, int]:
    from django.conf import settings

    model = params.get("model") or str(settings.RFT_DEMO_MODEL_DIR)
    engine, tokenizer = _engine_for(model, backend=params.get("engine", "transformers"))
    sampling = Sampling(temperature=params.get("temperature", 0.8), max_tokens=params.get("max_tokens", 128),
                        seed=params.get("seed", 0))
    counts = tasks_paraphrase(
        taskset_id=taskset_id, engine=engine, tokenizer=tokenizer, n=params.get("n", 1), sampling=sampling,
        instruction=params.get("instruction", "{prompt}"), require_numbers=params.get("require_numbers", True),
        max_tasks=params.get("max_tasks"),
    )
    _counts_record(run_id, counts)
    log.info("taskset_paraphrase %s: %s", taskset_id, counts)
    return counts


__all__: Sequence[str] = ("ParaphraseParams", "Sampling", "tasks_paraphrase", "taskset_paraphrase")
