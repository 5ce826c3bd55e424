"""Housekeeping of the environment API."""

from __future__ import annotations

from apps.envapi.agent_sessions import sessions_expire
from rftweb.taskkit import celery_task


@celery_task(name="apps.envapi.tasks.agent_sessions_expire_task", ignore_result=True, soft_time_limit=60, time_limit=90)
def agent_sessions_expire_task() -> int:
    """Agent sessions nobody finished become abandoned (idempotent; beat runs it)."""
    return sessions_expire()
