"""Typed live events on a run's channel-layer group, publishable from anywhere (views,
Celery tasks, management commands).

Each web process subscribes to a run's group once, for all its sockets of that run
(apps/runs/fanout.py), and forwards `{"type": "experience.created", "payload": {...}}` to the
browser as it came, or several in order in one `{"type": "batch", "events": [...]}` frame.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Sequence
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
    event_publish_many(run_id=run_id, events=[(type, payload)])


def event_publish_many(*, run_id: int, events: Sequence[tuple[str, dict[str, Any]]]) -> None:
    """Send several events to the run's group, in order, from sync code. One trip into the
    layer's event loop for all of them: each sync-to-async hop costs a fresh loop and Redis
    connection (about 6 ms), which for a 128-completion explore step was most of the step."""
    messages = [_message(type, payload) for type, payload in events]
    layer = get_channel_layer()
    if layer is None or not messages:
        return
    group = run_group(run_id)

    async def send_all() -> None:
        for message in messages:
            await layer.group_send(group, message)

    send = async_to_sync(send_all)
    try:
        if _loop_running_here():
            # Sync code on a thread that also runs an event loop (a Playwright-driven test, a
            # sync view under an async server): AsyncToSync refuses to block that loop's
            # thread, so the send runs on a helper thread and this one waits for it.
            errors: list[BaseException] = []
            helper = threading.Thread(target=_capture(errors, send), daemon=True)
            helper.start()
            helper.join(timeout=10)
            if errors:
                raise errors[0]
        else:
            send()
    except Exception:  # the layer being down must not fail a rollout or a training step
        log.exception("event_publish: could not send %s event(s) to run %s", len(messages), run_id)


def _loop_running_here() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _capture(errors: list[BaseException], fn: Any, *args: Any) -> Any:
    def run() -> None:
        try:
            fn(*args)
        except BaseException as exc:  # handed to the waiting thread
            errors.append(exc)

    return run


async def event_publish_async(*, run_id: int, type: str, payload: dict[str, Any]) -> None:
    message = _message(type, payload)
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        await layer.group_send(run_group(run_id), message)
    except Exception:
        log.exception("event_publish_async: could not send %s to run %s", type, run_id)
