"""Feedback arrival starts reward-model training without waiting for the beat: a label that
makes a new version due, or the owner's rejection of one the newest version learnt from,
enqueues `reward_model_train` once its transaction commits. A receiver, so the feedback
services stay unaware of reward models. And a run that ends releases the groups its people
hold (`run_ended`)."""

from __future__ import annotations


from django.db import transaction
from django.db.models.signals import post_save
from django.dispatch import receiver

from apps.feedback.kinds import kind_names
from apps.feedback.models import Feedback
from apps.runs.services import run_ended
from apps.feedback.reward_model.versions import reward_model_due
from apps.feedback.tasks import TRAIN_TASK
from rftweb.celery import app
from apps.feedback.handout.holds import holds_release


@receiver(post_save, sender=Feedback, dispatch_uid="rewards.feedback_saved_train")
def feedback_saved_train(sender: type[Feedback], instance: Feedback, created: bool,
                         update_fields: frozenset[str] | None = None, **_: object) -> None:
    rejected = (not created and update_fields is not None and "review" in update_fields
                and instance.review == Feedback.Review.REJECTED)
    if not (created or rejected) or instance.kind not in kind_names(labels=True):
        return
    run = instance.run
    if not run.cfg.reward_model.enabled or not reward_model_due(run=run):
        return

    run_id = run.pk
    transaction.on_commit(lambda: app.send_task(TRAIN_TASK, args=[run_id], queue="reward"))


@receiver(run_ended, dispatch_uid="apps.feedback.holds_release")
def run_ended_release_holds(sender: object, run_id: int, **_: object) -> None:
    """A run that ends (finish, fail, stop) holds no group for anyone any more: its people's
    groups are released inside the transition (apps.feedback.handout.holds.holds_release)."""
    holds_release(run_id=run_id)
