"""The live stream as it was before apps/runs/fanout.py, for bench/live_stream.py's baseline:
every socket is its own member of the run's stream (its Channels group), so each event is one channel-layer
message and one JSON encode per socket. Served by daphne as `bench.per_client_asgi:application`."""

from __future__ import annotations

import os
from typing import Any

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "rftweb.settings")
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from channels.routing import ProtocolTypeRouter, URLRouter
from channels.security.websocket import AllowedHostsOriginValidator
from django.urls import path

from apps.runs.consumers import run_socket_admit
from apps.runs.events import run_stream_name


class PerClientRunEventsConsumer(AsyncJsonWebsocketConsumer):  # type: ignore[misc]  # channels ships no types: its consumer is Any to mypy
    stream: str | None = None

    async def connect(self) -> None:
        run_id = await run_socket_admit(self)
        if run_id is None:
            return
        self.stream = run_stream_name(run_id)
        await self.channel_layer.group_add(self.stream, self.channel_name)
        await self.accept()

    async def disconnect(self, code: int) -> None:
        if self.stream:
            await self.channel_layer.group_discard(self.stream, self.channel_name)

    async def _forward(self, event: dict[str, Any]) -> None:
        await self.send_json({"type": event["type"], "payload": event.get("payload", {})})

    experience_created = _forward
    feedback_saved = _forward
    weights_synced = _forward
    run_metric = _forward
    run_status = _forward
    buffer_counts = _forward
    worker_heartbeat = _forward


application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "websocket": AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter([
            path("ws/runs/<int:run_id>/", PerClientRunEventsConsumer.as_asgi()),
        ]))),
    }
)
