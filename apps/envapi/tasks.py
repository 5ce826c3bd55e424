"""Housekeeping of the environment API."""

from __future__ import annotations

from celery import shared_task
from apps.envapi.agent_sessions import sessions_expire


@shared_task(name="apps.envapi.tasks.agent_sessions_expire_task", ignore_result=True, soft_time_limit=60, time_limit=90)  # type: ignore[untyped-decorator]  # celery ships no types
def agent_sessions_expire_task() -> int:
    """Agent sessions nobody finished become abandoned (idempotent; beat runs it)."""
    return sessions_expire()
