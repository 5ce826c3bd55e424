"""The run's live event stream for the browser."""

from __future__ import annotations

from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from apps.runs.events import run_group
from apps.runs.models import Run
from apps.runs.selectors import run_can_view


@database_sync_to_async
def _may_view(run_id: int, user: Any) -> bool:
    run = Run.objects.filter(pk=run_id).first()
    return run is not None and run_can_view(run=run, user=user)


class RunEventsConsumer(AsyncJsonWebsocketConsumer):
    """Joins `run.<id>` after checking the user may view the run; forwards typed events."""

    group: str | None = None

    async def connect(self) -> None:
        run_id = int(self.scope["url_route"]["kwargs"]["run_id"])
        user = self.scope.get("user")
        if user is None or not await _may_view(run_id, user):
            await self.close(code=4403)
            return
        self.group = run_group(run_id)
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()

    async def disconnect(self, code: int) -> None:
        if self.group:
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        # The stream is one-way; a ping gets a pong so clients can measure the link.
        if isinstance(content, dict) and content.get("type") == "ping":
            await self.send_json({"type": "pong", "payload": content.get("payload")})

    async def _forward(self, event: dict[str, Any]) -> None:
        await self.send_json({"type": event["type"], "payload": event.get("payload", {})})

    experience_created = _forward
    feedback_saved = _forward
    weights_synced = _forward
    run_metric = _forward
    run_status = _forward
    buffer_counts = _forward
    worker_heartbeat = _forward
