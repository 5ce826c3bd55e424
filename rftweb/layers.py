"""The project's channel layers.

`RedisBatchChannelLayer` (with Redis, the default): channels_redis's core layer, reading a
process's channel many messages per round trip. See its docstring.

`EmbeddedChannelLayer`: with no Redis, `manage.py rft_serve` runs the web server and the Celery worker threads in
one process. Channels' in-memory layer keeps asyncio queues that belong to the server's
event loop; a worker thread that publishes from its own loop must hand the send over to
that loop, or a waiting consumer may never wake up.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import redis.exceptions
from channels.layers import InMemoryChannelLayer
from channels_redis.core import RedisChannelLayer

log = logging.getLogger(__name__)

# What a pooled connection that went stale answers (Redis restarted, or the network dropped
# it): the server closed it, or the socket is reset. A timeout is not one of them (the
# command may have run), nor is a refused connect (Redis is down: a retry would fail too).
STALE_CONNECTION: tuple[type[Exception], ...] = (redis.exceptions.ConnectionError, ConnectionResetError,
                                                 BrokenPipeError)

# Moves up to ARGV[1] of the oldest messages of KEYS[1] (a channel's sorted set) into KEYS[2]
# (its in-flight backup) and returns them with their scores, oldest first: atomic, so a
# receiver cancelled while waiting for the answer loses nothing (the next receive puts the
# backup back, as channels_redis does for the one message it pops).
_POP_MORE = """
local popped = redis.call('ZPOPMIN', KEYS[1], ARGV[1])
for i = 1, #popped, 2 do
    redis.call('ZADD', KEYS[2], popped[i + 1], popped[i])
end
return popped
"""


class EmbeddedChannelLayer(InMemoryChannelLayer):  # type: ignore[misc]  # channels ships no types
    _server_loop: asyncio.AbstractEventLoop | None = None

    def _foreign(self) -> asyncio.AbstractEventLoop | None:
        loop = self._server_loop
        if loop is None or not loop.is_running() or loop is asyncio.get_running_loop():
            return None
        return loop

    async def receive(self, channel: str) -> dict[str, object]:
        # Consumers receive on the server's loop: remember it.
        self._server_loop = asyncio.get_running_loop()
        message: dict[str, object] = await super().receive(channel)
        return message

    async def send(self, channel: str, message: dict[str, object]) -> None:
        loop = self._foreign()
        if loop is None:
            await super().send(channel, message)
            return
        await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(InMemoryChannelLayer.send(self, channel, message), loop))

    async def group_send(self, group: str, message: dict[str, object]) -> None:
        loop = self._foreign()
        if loop is None:
            await super().group_send(group, message)
            return
        await asyncio.wrap_future(
            asyncio.run_coroutine_threadsafe(InMemoryChannelLayer.group_send(self, group, message), loop)
        )


class RedisBatchChannelLayer(RedisChannelLayer):  # type: ignore[misc]  # channels_redis ships no types
    """channels_redis's core layer, reading a process's own channel in batches.

    Every channel of a process (its `new_channel()` names, `specific.<prefix>!...`: the live
    stream's hub of each run, the runs lists' sockets, the API's event streams) shares one
    Redis sorted set, and core pops it one message per four round trips (restore the backup,
    BZPOPMIN, back the message up, clear the backup), each waiting its turn on the process's
    event loop. Under bench/web_load's 200 people (about 20 layer messages a second per
    process, the loop busy with requests) that reader fell 30 s behind, and `group_send`
    drops what has waited longer than `expiry` from a channel's set: whole seconds of
    events never reached the process's sockets. Here, once one message has arrived, up to
    RECEIVE_BATCH more that are already waiting come in the same turn (one more round trip),
    with the same cancellation guarantee (each is in the backup until it is in the buffer).
    """

    RECEIVE_BATCH = 200
    # How long a cancelled receive may go on before it is cancelled again (see `receive`).
    RECANCEL_SECONDS = 0.1

    async def group_send(self, group: str, message: dict[str, object]) -> None:
        """core's group_send, sent once more on fresh connections when the first try met a
        stale one. After a Redis restart a publisher's pooled connection is closed by the
        server, and the first event it sent was dropped (redis-py tells the caller, and only
        the next command reconnects): the live page missed, say, the first `weights.synced`
        after the restart (issue 66)."""
        await self._fresh_once(group, lambda: super(RedisBatchChannelLayer, self).group_send(group, message))

    async def group_add(self, group: str, channel: str) -> None:
        """core's group_add, once more on fresh connections like group_send (adding twice is
        adding once)."""
        await self._fresh_once(group, lambda: super(RedisBatchChannelLayer, self).group_add(group, channel))

    async def _fresh_once(self, group: str, call: Callable[[], Awaitable[None]]) -> None:
        try:
            await call()
        except STALE_CONNECTION as exc:
            # The pool's idle connections are as old as the one that failed: drop them all,
            # so the second try connects anew (the ones in use by receives are left alone).
            pool = self.connection(self.consistent_hash(group)).connection_pool
            await pool.disconnect(inuse_connections=False)
            log.info("channel layer: a stale Redis connection failed a send to %s (%s); sending again", group, exc)
            await call()

    async def receive(self, channel: str) -> dict[str, object]:
        """core's receive, made to end when it is cancelled. channels_redis 4.3 over redis-py
        8.1 swallows a cancel that lands in a receive's first milliseconds (52 of 200 at 0.5-2
        ms) or at one of its BZPOPMINs' turns (1-2 of 100 at random moments), then waits for a
        reply that never comes: a consumer whose socket closed never ended, and a test's event
        loop waited for it at its close until pytest-timeout's 900 s (2026-11-27). So the
        receive runs as a task of its own, and a cancel of ours is passed on to it at once and
        again until it has ended. A message it gets after the cancel is dropped: the consumer
        that asked for it is going."""
        inner: asyncio.Task[dict[str, object]] = asyncio.ensure_future(super().receive(channel))
        try:
            return await asyncio.shield(inner)
        except asyncio.CancelledError:
            await cancelled_until_done(inner, every=self.RECANCEL_SECONDS)
            raise

    async def receive_single(self, channel: str) -> tuple[str | list[str], dict[str, object]]:
        if "!" not in channel:
            single: tuple[str | list[str], dict[str, object]] = await super().receive_single(channel)
            return single
        index = self.consistent_hash(channel)
        channel_key = self.prefix + channel
        backup_key = self._backup_channel_name(channel_key)
        connection = self.connection(index)
        await self.receive_clean_locks.acquire(channel_key)
        try:
            first = None
            while first is None:
                first = await self._brpop_with_clean(index, channel_key, timeout=self.brpop_timeout)
            more = await connection.eval(_POP_MORE, 2, channel_key, backup_key, self.RECEIVE_BATCH)
        except BaseException:
            self.receive_clean_locks.release(channel_key)
            raise
        contents = [first] + list(more[0::2])
        # Every message but the last goes into the buffers here, in order and with no await
        # between: receive() puts the one returned after them.
        decoded = [self._unpack(content, channel) for content in contents]
        for target, message in decoded[:-1]:
            for name in target if isinstance(target, list) else [target]:
                self.receive_buffer[name].put_nowait(message)
        # All of them are buffered now: the backup goes (and with it the lock), as core's
        # cleaner does for its one message.
        cleaner = asyncio.ensure_future(connection.delete(backup_key))
        self.receive_cleaners.append(cleaner)

        def cleaned(task: asyncio.Future[object]) -> None:
            self.receive_cleaners.remove(task)
            self.receive_clean_locks.release(channel_key)

        cleaner.add_done_callback(cleaned)
        return decoded[-1]

    async def close_pools(self) -> None:
        """Close the running event loop's connections, and only those. channels_redis closes
        every loop's: another loop's connection cannot be closed from this one, and awaiting
        it left the caller waiting for ever on a future of that loop (the live stream's
        reader, resetting its connections after a failure: a test's teardown hung 15 min).
        Another loop's connections close with that loop (channels_redis wraps `loop.close`)."""
        loop = asyncio.get_running_loop()
        cleaners = [cleaner for cleaner in self.receive_cleaners if cleaner.get_loop() is loop]
        if cleaners:
            await asyncio.wait(cleaners)
        layer = self._layers.get(loop)
        if layer is not None:
            await layer.flush()

    def _unpack(self, content: bytes, channel: str) -> tuple[str | list[str], dict[str, object]]:
        message: dict[str, object] = self.deserialize(content)
        target = message.pop("__asgi_channel__", channel)
        assert isinstance(target, (str, list))
        return target, message


async def cancelled_until_done(task: asyncio.Task[dict[str, object]], *, every: float) -> None:
    """Cancel `task` every `every` seconds until it has ended, whatever cancels this caller
    meanwhile (a second cancel of the caller must not leave the task running)."""
    while not task.done():
        task.cancel()
        try:
            await asyncio.wait([task], timeout=every)
        except asyncio.CancelledError:
            continue
    if not task.cancelled():
        task.exception()  # retrieved: an error of a receive nobody waits for any more is no error
