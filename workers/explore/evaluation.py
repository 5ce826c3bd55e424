"""Held-out evaluation during a run: `workers.explore.evaluation.evaluate(run_id, version)` on the
`rollout` queue.

When a version whose number is a multiple of the run's `eval_every` is published
(`apps.runs.services.model_version_publish`), this task is sent. It samples the run's
evaluation taskset (`eval.taskset`, the first `eval.max_tasks` tasks) with that version
(greedy unless `eval.sampling` says otherwise), scores each completion with the run's inline
reward terms and the task domain's verifier, and records `eval/…` metrics at the version's
train step, so they chart beside the training curves:

- `eval/accuracy`: the share of answers the domain's verifier finds right (math equivalence
  with the reference, every code test passing, …; apps/rewards/verify.py), over the answers
  it can verify; not recorded where none can be (a K-12 taskset, tasks without references);
- `eval/format_share`: the share of well-formed answers, where the domain checks form;
- `eval/reward_mean` / `eval/reward_std`: the run's reward, format terms and all;
- `eval/preference/<name>`: the share each of `eval.preferences` likes.

(Before these, `eval/accuracy` was the share of answers scoring above 0, which a format term
alone reaches; migration runs/0009 renamed those stored rows `eval/positive_share`.) Nothing is written to the buffer: evaluation never trains.

The trainer never waits for it (it is a separate task on another queue); explorers share
the rollout workers with it, and the resident engine goes back to the version the next
explore step needs (`engine_version_ensure`). Idempotent: a version already evaluated is
not evaluated again. Terms scored on the `reward` queue (judges, sandboxes) are left out of
the evaluation score.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, TypedDict

from apps.buffer.ports import taskset_tasks
from apps.rewards.ports import answer_verdict, rewards_inline
from apps.runs.ports import eval_result_record, metric_exists, preference_shares, run_view, version_train_step
from workers.engines import SamplingSpec
from workers.explore.explorer import engine_at, task_prompt, worker_name
from workers.explore.guarded import EVALUATION_TASK_OPTIONS, failure_dropped

from rftweb.taskkit import celery_task

if TYPE_CHECKING:
    from apps.rewards.ports import Verdict

log = logging.getLogger(__name__)

EVAL_PREFIX = "eval/"


class EvalOutcome(TypedDict, total=False):
    """What an evaluation returns: its figures, or why it skipped or failed."""

    run: int
    version: int
    skipped: str
    failed: str
    step: int
    reward_mean: float
    # The run's best evaluated version so far.
    best_version: int


def verdict_shares(verdicts: Sequence[Verdict]) -> dict[str, float]:
    """`accuracy` (right answers over the verified ones) and `format_share` (well-formed over
    the form-checked ones), each only where some answer had that check."""
    out: dict[str, float] = {}
    verified = [v.correct for v in verdicts if v.correct is not None]
    if verified:
        out["accuracy"] = sum(verified) / len(verified)
    formed = [v.well_formed for v in verdicts if v.well_formed is not None]
    if formed:
        out["format_share"] = sum(formed) / len(formed)
    return out


def evaluate_version(*, run_id: int, version: int, worker: str | None = None) -> EvalOutcome:
    """Evaluate `version` of run `run_id` on its evaluation taskset (the task's body)."""

    run = run_view(run_id)
    if run is None:
        return {"run": run_id, "version": version, "skipped": "no such run"}
    cfg = run.config
    if cfg.eval.taskset is None:
        return {"run": run_id, "version": version, "skipped": "the run has no evaluation taskset"}
    step = 0
    if version > 0:
        found = version_train_step(run_id=run.id, number=version)
        if found is None:
            return {"run": run_id, "version": version, "skipped": "no such version"}
        step = found
    if metric_exists(run_id=run.id, step=step, name=f"{EVAL_PREFIX}reward_mean"):
        return {"run": run_id, "version": version, "skipped": "already evaluated"}
    tasks = taskset_tasks(taskset_id=cfg.eval.taskset, limit=cfg.eval.max_tasks)
    if not tasks:
        return {"run": run_id, "version": version, "skipped": f"evaluation taskset {cfg.eval.taskset} has no tasks"}

    started = time.monotonic()
    engine = engine_at(run=run, version=version, worker=worker or worker_name())
    # Tasks with pictures go in with them (an ImagePrompt), as the explorer sends them.
    prompts = [task_prompt(engine, task) for task in tasks]
    groups = engine.generate(prompts, n=cfg.eval.n, sampling=SamplingSpec.from_config(cfg.eval.sampling))
    scores: list[float] = []
    lengths: list[int] = []
    answers: list[tuple[str, str]] = []
    for task, samples in zip(tasks, groups):
        for sample in samples:
            scores.append(rewards_inline(terms=cfg.rewards, completion=sample.text, task=task).score)
            lengths.append(len(sample.token_ids))
            answers.append((task.prompt, sample.text))
    checks = verdict_shares([answer_verdict(completion=text, task=task)
                             for task, samples in zip(tasks, groups) for text in (s.text for s in samples)])
    # What people teach, measured on the same answers; no reward term sees these shares.
    shares = preference_shares(cfg.eval.preferences, answers)
    values = {
        f"{EVAL_PREFIX}reward_mean": statistics.fmean(scores),
        f"{EVAL_PREFIX}reward_std": statistics.pstdev(scores),
        **{f"{EVAL_PREFIX}{name}": share for name, share in checks.items()},
        f"{EVAL_PREFIX}response_length": statistics.fmean(lengths),
        f"{EVAL_PREFIX}version": float(version),
        f"{EVAL_PREFIX}tasks": float(len(tasks)),
        f"{EVAL_PREFIX}seconds": time.monotonic() - started,
        **{f"{EVAL_PREFIX}preference/{name}": share for name, share in shares.items()},
    }
    best = eval_result_record(run=run, version=version, step=step, values=values)
    return {"run": run_id, "version": version, "step": step, "reward_mean": values[f"{EVAL_PREFIX}reward_mean"],
            "best_version": best}


# Reads the buffer's tasks and writes metrics only, so a redelivery is harmless (and skipped
# once the metrics are there). A failure other than the database's is logged and dropped
# (workers/explore/guarded.py).
@celery_task(name="workers.explore.evaluation.evaluate", **EVALUATION_TASK_OPTIONS)
def evaluate(run_id: int, version: int) -> EvalOutcome:
    def failed(error: str) -> EvalOutcome:
        log.exception("evaluation of run %s version %s failed", run_id, version)
        return {"run": run_id, "version": version, "failed": error}

    return failure_dropped(lambda: evaluate_version(run_id=run_id, version=version), failed)
