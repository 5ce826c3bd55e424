"""Celery tasks of the RFT core: the per-run conductor and the resume-after-restart path.
(Autodiscovered as `apps.runs.conduct`, see rftweb/celery.py; apps/runs/tasks.py is the
dashboard's.)

Both are thin: the decisions live in `apps.runs.orchestration`.
"""

from __future__ import annotations

import logging

from celery import shared_task
from celery.signals import worker_ready

from apps.runs.orchestration import conduct_next, conduct_tick, runs_resume

log = logging.getLogger(__name__)


# Not acked late and never retried: a lost beat is replaced by the next kick or the beat
# schedule's `runs_resume_task`; one chain per run is enforced by conduct_tick's marker.
@shared_task(name="apps.runs.conduct.run_conduct", ignore_result=True, acks_late=False, time_limit=60, soft_time_limit=50)
def run_conduct(run_id: int, token: str) -> None:
    try:
        keep_going = conduct_tick(run_id=run_id, token=token)
    except Exception:
        # A database or Redis hiccup must not end the chain: the run would stall until the beat.
        log.exception("conductor of run %s: beat failed; trying again", run_id)
        keep_going = True
    if keep_going:
        conduct_next(run_id=run_id, token=token)


# Periodic (beat) safety net: restarts a conductor for any running run whose chain broke.
@shared_task(name="apps.runs.conduct.runs_resume_task", ignore_result=True, acks_late=False, time_limit=60)
def runs_resume_task(clear_markers: bool = False) -> list[int]:
    return runs_resume(clear_markers=clear_markers)


@worker_ready.connect
def _resume_on_worker_start(sender: object = None, **_: object) -> None:
    """A worker that serves the conductor's queue came up: running runs go on from where the
    database says they are (after a full restart nothing else would restart them)."""
    consumer = sender
    queues = {q.name for q in getattr(getattr(consumer, "task_consumer", None), "queues", [])} if consumer else set()
    if queues and "default" not in queues:
        return
    try:
        ids = runs_resume(clear_markers=True)
        if ids:
            log.info("resumed runs %s", ids)
    except Exception:  # a worker must come up even when the database is not there yet
        log.exception("could not resume running runs at worker start")
