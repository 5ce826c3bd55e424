"""The reward queue: scores the terms the explorer does not score inline (code in the
sandbox, reward models, LLM judges) and folds them into the experiences.

Policy of `score_experiences`: queue `reward`, acknowledged late (a worker that dies hands
the task back), soft limit 15 min / hard 16 min per batch. Database hiccups retry with
backoff (up to 5 times). A scorer that raises is retried up to 3 times; on the last try its
term scores 0 for those experiences and the error lands in `metadata["reward_errors"]`,
so no experience waits forever. Idempotent: only experiences whose
`metadata["awaiting_rewards"]` is non-empty are scored, and the apply re-checks that under
a row lock.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Sequence

from celery import Task
from django.db import InterfaceError, OperationalError

from apps.rewards.ports import (
    ExperienceRecord,
    experience_rewards_apply,
    experiences_awaiting_rewards,
    reward_term_score,
    rewards_for_domain,
    run_current_model,
    task_domain,
)
from apps.runs.ports import RunView, run_view
from kernel.config import RewardTerm
from rftweb.taskkit import celery_bound_task
from workers.reward.k12 import K12_SCORERS, Verdict
from workers.reward.scorers import BATCH_SCORERS

log = logging.getLogger(__name__)

SCORER_RETRIES = 3


def _task_of(exp: ExperienceRecord) -> object:
    if exp.task is not None:
        return exp.task
    # Experiences from environments may have no task row: score against what they carry.
    return {"domain": exp.metadata.get("domain", "general"), "prompt": exp.prompt_text,
            "reference": exp.metadata.get("reference")}


def rewards_remote_score(
    *, run: RunView, experiences: Sequence[ExperienceRecord], reasons: dict[int, dict[str, str]] | None = None,
) -> tuple[dict[int, dict[str, float]], dict[int, dict[str, str]], bool]:
    """Score each experience's awaited terms: (parts by experience id, errors by experience id,
    whether a scorer raised, which a retry may cure).

    Batch scorers (models) get every experience that awaits the same term in one call. The
    K-12 graders (workers/reward/k12.py) also get the run and give a reason with each score, which
    lands in `reasons` (by experience id, then term key) when given.
    """

    terms = run.config.rewards
    scored: dict[int, dict[str, float]] = {e.pk: {} for e in experiences}
    errors: dict[int, dict[str, str]] = defaultdict(dict)
    # key -> (term, [experiences awaiting it])
    groups: dict[str, tuple[RewardTerm, list[ExperienceRecord]]] = {}
    raised = False
    for exp in experiences:
        applicable = dict(rewards_for_domain(terms=terms, domain=task_domain(_task_of(exp))))
        for key in exp.metadata.get("awaiting_rewards") or []:
            term = applicable.get(key)
            if term is None:
                errors[exp.pk][key] = "not a reward of this run for this domain"
                continue
            groups.setdefault(key, (term, []))[1].append(exp)
    for key, (term, members) in groups.items():
        tasks = [_task_of(e) for e in members]
        completions = [e.response_text for e in members]
        batch: Callable[..., Sequence[float | Verdict]] | None = BATCH_SCORERS.get(term.name) or K12_SCORERS.get(term.name)
        if batch is None:
            for exp, task, completion in zip(members, tasks, completions, strict=True):
                scored[exp.pk][key] = reward_term_score(term=term, completion=completion, task=task)
            continue
        params = dict(term.params)
        if term.name == "llm_judge" and not params.get("model"):
            params["model"] = run_current_model(run=run)
        if term.name in K12_SCORERS:
            params["run"] = run
        try:
            values = batch(completions, tasks, **params)
        except Exception as exc:
            raised = True
            log.exception("reward %s failed for %d experiences of run %s", key, len(members), run.id)
            for exp in members:
                errors[exp.pk][key] = f"{type(exc).__name__}: {exc}"[:500]
                scored[exp.pk][key] = 0.0
            continue
        for exp, value in zip(members, values, strict=True):
            reason = getattr(value, "reason", None)
            if reason is not None and reasons is not None:
                reasons.setdefault(exp.pk, {})[key] = reason
            scored[exp.pk][key] = float(value.score if isinstance(value, Verdict) else value)
    return scored, dict(errors), raised


@celery_bound_task(
    name="workers.reward.scoring.score_experiences",
    acks_late=True,
    reject_on_worker_lost=True,
    soft_time_limit=900,
    time_limit=960,
    autoretry_for=(OperationalError, InterfaceError),
    retry_backoff=True,
    retry_backoff_max=120,
    max_retries=5,
)
def score_experiences(self: Task, run_id: int, experience_ids: list[int]) -> dict[str, int]:
    run = run_view(run_id)
    if run is None:
        return {"applied": 0, "skipped": len(experience_ids)}
    pending = experiences_awaiting_rewards(run=run, ids=experience_ids)
    if not pending:
        return {"applied": 0, "skipped": len(experience_ids)}
    reasons: dict[int, dict[str, str]] = {}
    scored, errors, raised = rewards_remote_score(run=run, experiences=pending, reasons=reasons)
    if raised and self.request.retries < SCORER_RETRIES:
        raise self.retry(countdown=5 * (self.request.retries + 1), max_retries=SCORER_RETRIES)
    applied = experience_rewards_apply(run=run, scored=scored, errors=errors, reasons=reasons)
    return {"applied": len(applied), "skipped": len(experience_ids) - len(applied)}
