"""Typed live events on a run's channel-layer group, publishable from anywhere (views,
Celery tasks, management commands).

A consumer receives `{"type": "experience.created", ...}` as a call of its
`experience_created` method (Channels' dispatch), so every type here has such a method on
`RunEventsConsumer`.
"""

from __future__ import annotations

import logging
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

log = logging.getLogger(__name__)

EVENT_TYPES = (
    "experience.created",
    "feedback.saved",
    "weights.synced",
    "run.metric",
    "run.status",
    "buffer.counts",
    "worker.heartbeat",
)


def run_group(run_id: int) -> str:
    return f"run.{run_id}"


def _message(type: str, payload: dict[str, Any]) -> dict[str, Any]:
    if type not in EVENT_TYPES:
        raise ValueError(f"unknown event type {type!r}; known: {', '.join(EVENT_TYPES)}")
    return {"type": type, "payload": payload}


def event_publish(*, run_id: int, type: str, payload: dict[str, Any]) -> None:
    """Send one event to the run's group. Never raises for a broken layer: live events are
    a view of the buffer, which stays the source of truth."""
    message = _message(type, payload)
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        async_to_sync(layer.group_send)(run_group(run_id), message)
    except Exception:  # the layer being down must not fail a rollout or a training step
        log.exception("event_publish: could not send %s to run %s", type, run_id)


async def event_publish_async(*, run_id: int, type: str, payload: dict[str, Any]) -> None:
    message = _message(type, payload)
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        await layer.group_send(run_group(run_id), message)
    except Exception:
        log.exception("event_publish_async: could not send %s to run %s", type, run_id)
