"""Periodic housekeeping of feedback: wait windows and abandoned annotation leases."""

from __future__ import annotations

from celery import shared_task

from apps.feedback.services import assignment_reap, feedback_wait_expire


# Idempotent (conditional updates on status pending); the next beat retries, so no retry here.
@shared_task(name="apps.feedback.tasks.feedback_wait_expire_task", ignore_result=True, time_limit=120,
             soft_time_limit=100, acks_late=False)
def feedback_wait_expire_task() -> dict[str, int]:
    result = feedback_wait_expire()
    return {"groups_ready": result.groups_ready, "groups_dropped": result.groups_dropped}


@shared_task(name="apps.feedback.tasks.assignment_reap_task", ignore_result=True, time_limit=60,
             soft_time_limit=50, acks_late=False)
def assignment_reap_task() -> int:
    return assignment_reap()
