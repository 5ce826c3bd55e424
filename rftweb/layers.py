"""The embedded default's channel layer.

With no Redis, `manage.py rft_serve` runs the web server and the Celery worker threads in
one process. Channels' in-memory layer keeps asyncio queues that belong to the server's
event loop; a worker thread that publishes from its own loop must hand the send over to
that loop, or a waiting consumer may never wake up.
"""

from __future__ import annotations

import asyncio
from channels.layers import InMemoryChannelLayer


class EmbeddedChannelLayer(InMemoryChannelLayer):
    _server_loop: asyncio.AbstractEventLoop | None = None

    def _foreign(self) -> asyncio.AbstractEventLoop | None:
        loop = self._server_loop
        if loop is None or not loop.is_running() or loop is asyncio.get_running_loop():
            return None
        return loop

    async def receive(self, channel: str) -> dict[str, object]:
        # Consumers receive on the server's loop: remember it.
        self._server_loop = asyncio.get_running_loop()
        return await super().receive(channel)

    async def send(self, channel: str, message: dict[str, object]) -> None:
        loop = self._foreign()
        if loop is None:
            return await super().send(channel, message)
        await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(InMemoryChannelLayer.send(self, channel, message), loop))

    async def group_send(self, group: str, message: dict[str, object]) -> None:
        loop = self._foreign()
        if loop is None:
            return await super().group_send(group, message)
        await asyncio.wrap_future(
            asyncio.run_coroutine_threadsafe(InMemoryChannelLayer.group_send(self, group, message), loop)
        )
