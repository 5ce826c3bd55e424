"""The answers of a blind side-by-side evaluation (apps/evaluation): `workers.explore.blind.
answers_generate(evaluation_id)` on the `rollout` queue.

For every (version, prompt, seed) the evaluation lacks an answer for, the version is loaded
through the run's own engine path (`workers.explore.explorer.engine_at`, as the held-out evaluation
does: the resident engine, the weight handover, the load recorded) and sampled with the run's
`eval.sampling` at the evaluation's recorded seed; the answers are written through
apps/evaluation/ports.py, cached by (run, version, prompt, seed), so a version answers a
prompt once for every evaluation that asks. Once none is missing the evaluation opens for
votes (its pairs drawn then).

Idempotent: an answer already cached is not generated again, and an evaluation no longer
waiting for answers is skipped. Nothing is written to the buffer: evaluation never trains.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from typing import TypedDict

from apps.evaluation.ports import AnswerNeed, answer_record, answers_needed, evaluation_failed, evaluation_open
from apps.runs.ports import run_view
from rftweb.taskkit import celery_task
from workers.engines import SamplingSpec, prompt_ids
from workers.explore.explorer import engine_at, worker_name
from workers.explore.guarded import EVALUATION_TASK_OPTIONS, failure_dropped

log = logging.getLogger(__name__)


class BlindOutcome(TypedDict, total=False):
    evaluation: int
    written: int
    opened: bool
    skipped: str
    failed: str


def _messages(need: AnswerNeed) -> list[dict[str, str]] | None:
    if need.text or not isinstance(need.messages, list):
        return None
    return [{"role": str(m.get("role", "user")), "content": str(m.get("content", ""))}
            for m in need.messages if isinstance(m, dict)]


def answers_write(*, evaluation_id: int, worker: str | None = None) -> BlindOutcome:
    """Write the answers evaluation `evaluation_id` lacks, then open it (the task's body)."""
    needs = answers_needed(evaluation_id=evaluation_id)
    if needs is None:
        return {"evaluation": evaluation_id, "skipped": "no such evaluation waiting for answers"}
    by_version: dict[tuple[int, int], list[AnswerNeed]] = defaultdict(list)
    for need in needs:
        by_version[(need.run_id, need.version)].append(need)
    written = 0
    for (run_id, version), wanted in sorted(by_version.items()):
        run = run_view(run_id)
        if run is None:
            raise LookupError(f"run {run_id} is gone")
        engine = engine_at(run=run, version=version, worker=worker or worker_name())
        base = SamplingSpec.from_config(run.config.eval.sampling)
        # One call per seed (an evaluation has one): the seed is part of the cache key.
        for seed in sorted({n.seed for n in wanted}):
            batch = [n for n in wanted if n.seed == seed]
            prompts = [prompt_ids(engine.tokenizer, messages=m) if (m := _messages(n)) is not None
                       else prompt_ids(engine.tokenizer, text=n.text) for n in batch]
            groups = engine.generate(prompts, n=1, sampling=base.with_overrides({"seed": seed}))
            for need, samples in zip(batch, groups):
                answer_record(need=need, text=samples[0].text)
                written += 1
    return {"evaluation": evaluation_id, "written": written, "opened": evaluation_open(evaluation_id=evaluation_id)}


# A failure other than the database's is recorded on the evaluation (its page says why) and
# dropped (workers/explore/guarded.py).
@celery_task(name="workers.explore.blind.answers_generate", **EVALUATION_TASK_OPTIONS)
def answers_generate(evaluation_id: int) -> BlindOutcome:
    def failed(error: str) -> BlindOutcome:
        log.exception("blind evaluation %s: answers failed", evaluation_id)
        evaluation_failed(evaluation_id=evaluation_id, error=error)
        return {"evaluation": evaluation_id, "failed": error}

    return failure_dropped(lambda: answers_write(evaluation_id=evaluation_id), failed)
