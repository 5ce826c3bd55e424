"""Periodic housekeeping of feedback: wait windows and abandoned annotation leases; the beat
of the learned reward model (retrain where labels came in, score what is unscored).

Feedback arrival also enqueues training at once (apps.feedback.signals); the reward-model beat
is the safety net for a lost message and the trigger for scoring new experiences of `learned`
runs. Idempotent: the worker tasks check what is due themselves. Every task is named after its
module and function (the beat was `apps.rewards.tasks.reward_model_beat_task` until round 49)."""

from __future__ import annotations

from apps.feedback.reward_model.versions import experiences_to_score, reward_model_due, reward_model_latest
from apps.feedback.handout.lease import assignment_reap
from apps.feedback.handout.expiry import feedback_wait_expire
from apps.runs.models import Run
from rftweb.celery import app
from rftweb.taskkit import celery_task


# Idempotent (conditional updates on status pending); the next beat retries, so no retry here.
@celery_task(name="apps.feedback.tasks.feedback_wait_expire_task", ignore_result=True, time_limit=120,
             soft_time_limit=100, acks_late=False)
def feedback_wait_expire_task() -> dict[str, int]:
    result = feedback_wait_expire()
    return {"groups_ready": result.groups_ready, "groups_dropped": result.groups_dropped}


@celery_task(name="apps.feedback.tasks.assignment_reap_task", ignore_result=True, time_limit=60,
             soft_time_limit=50, acks_late=False)
def assignment_reap_task() -> int:
    return assignment_reap()


TRAIN_TASK = "workers.reward.trainer.reward_model_train"
SCORE_TASK = "workers.reward.trainer.reward_model_score"


@celery_task(name="apps.feedback.tasks.reward_model_beat_task", ignore_result=True, time_limit=60,
             soft_time_limit=50, acks_late=False)
def reward_model_beat_task() -> dict[str, int]:
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
