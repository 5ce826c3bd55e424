"""Beat of the learned reward model: retrain where labels came in, score what is unscored.

Feedback arrival also enqueues training at once (apps.rewards.signals); this beat is the
safety net for a lost message and the trigger for scoring new experiences of `learned` runs.
Idempotent: the worker tasks check what is due themselves.
"""

from __future__ import annotations

from celery import shared_task

from apps.rewards.learned import experiences_to_score, reward_model_due, reward_model_latest
from apps.runs.models import Run

TRAIN_TASK = "workers.reward_trainer.reward_model_train"
SCORE_TASK = "workers.reward_trainer.reward_model_score"


@shared_task(name="apps.rewards.tasks.reward_model_beat_task", ignore_result=True, time_limit=60,
             soft_time_limit=50, acks_late=False)
def reward_model_beat_task() -> dict[str, int]:
    from rftweb.celery import app

    trained = scored = 0
    for run in Run.objects.filter(status=Run.Status.RUNNING):
        if not run.cfg.reward_model.enabled:
            continue
        if reward_model_due(run=run):
            app.send_task(TRAIN_TASK, args=[run.pk], queue="reward")
            trained += 1
        rm = reward_model_latest(run=run)
        if rm is not None and experiences_to_score(run=run, rm=rm, limit=1).exists():
            app.send_task(SCORE_TASK, args=[run.pk], queue="reward")
            scored += 1
    return {"train": trained, "score": scored}
