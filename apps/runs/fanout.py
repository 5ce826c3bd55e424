"""One channel-layer subscription per run per web process, fanned out to that process's sockets.

Why: with one stream member (a Channels group member) per browser socket, every event became N channel-layer messages
(N Redis list entries, pulled back one blocking pop at a time) and N JSON encodes in the same
process. At 50 sockets and 200 events/s that is 10,000 layer messages a second through one
process: the per-process queue overflowed its capacity, deliveries were dropped, and p99
reached seconds (bench/live_stream.py). Here the first socket of a run in a process
subscribes the process once; each event crosses Redis once per process, is encoded once,
and the same text goes to every local socket.

Frames: a frame carries one event, `{"type": ..., "payload": ...}`, as before; when several
events are waiting (under load, or a worker's burst) one frame carries them in order as
`{"type": "batch", "events": [{"type": ..., "payload": ...}, ...]}`. A quiet stream is sent
at once; a busy one is flushed at most every FLUSH_INTERVAL, which bounds the frames a
socket costs per second no matter the event rate.

Slow sockets: each socket has its own outbox drained by its own task, so a socket that
cannot keep up never delays the others. An outbox over CLIENT_BUFFER_BYTES closes its
socket with SLOW_CLIENT_CLOSE_CODE; browsers reconnect and catch up from the buffer (the
live stream is a view of Postgres, which stays the source of truth). Under daphne a send
never waits for the client (daphne buffers in Twisted and closes a socket that stops
answering pings), so the outbox only fills when the process itself falls behind; under a
server that applies backpressure (uvicorn) it is what bounds a stalled client.
"""

from __future__ import annotations

import asyncio
import json
import logging
import weakref
from collections import deque
from collections.abc import Awaitable, Coroutine
from typing import Protocol

from channels.layers import get_channel_layer
from django.conf import settings

from apps.runs.events import LayerMessage, layer_events, run_stream_name
from rftweb.degrade import REDIS_ERRORS, TRY_AGAIN_CLOSE_CODE

log = logging.getLogger(__name__)

# At most one frame per socket per interval under load (seconds; RFT_LIVE_FLUSH_MS): 200
# events/s to 50 sockets become ~67 frames/s per socket instead of 200, and latency grows by
# at most this much.
FLUSH_INTERVAL = settings.RFT_LIVE_FLUSH_MS / 1000.0
# A batch frame stays under this many bytes (several frames for a larger backlog): common
# websocket clients refuse messages over 1 MiB by default (Python's websockets does).
MAX_FRAME_BYTES = 256 * 1024
# What a socket may have queued and unsent before it is closed as too slow (bytes of frames).
CLIENT_BUFFER_BYTES = 1 << 20
# Application close code (4000-4999) for "closed because it did not keep up"; clients reconnect.
SLOW_CLIENT_CLOSE_CODE = 4008
# Close code when the process lost its subscription because Redis went away (stopped,
# restarted, the network dropped): RFC 6455's 1013, try again later, as a handshake refused
# for the same reason (apps/runs/consumers.py); the pages reconnect and resubscribe.
RESUBSCRIBE_CLOSE_CODE = TRY_AGAIN_CLOSE_CODE
# Close code when the subscription failed for another reason (a bug): the server's error.
FAILED_CLOSE_CODE = 1011
# What the layer's receive raises when Redis is unreachable: redis-py's errors, the sockets' own.
LAYER_DOWN: tuple[type[Exception], ...] = (*REDIS_ERRORS, OSError)
# channels_redis forgets a group member after group_expiry (a day by default); a hub lives
# as long as its run has viewers, so it renews its membership well before that.
GROUP_RENEW_SECONDS = 3600.0


class LiveSocket(Protocol):
    """What the hub needs from a socket: a consumer's send and close."""

    def send(self, text_data: str | None = None, bytes_data: bytes | None = None,
             close: bool = False) -> Awaitable[None]: ...

    def close(self, code: int | None = None, reason: str | None = None) -> Awaitable[None]: ...


class Member:
    """One socket's place in a hub: its outbox and the task that drains it, in order."""

    def __init__(self, hub: RunFanout, socket: LiveSocket) -> None:
        self.hub = hub
        self.socket = socket
        self.outbox: deque[str] = deque()
        self.queued_bytes = 0
        self.closed_code: int | None = None
        self._wake = asyncio.Event()
        self._sender: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Begin sending; frames that arrived since joining go first. Call after accept()."""
        if self._sender is None and self.closed_code is None:
            self._sender = asyncio.create_task(self._send_loop(), name=f"fanout-send-{self.hub.run_id}")

    def push(self, frame: str) -> None:
        if self.closed_code is not None:
            return
        # An empty outbox takes any frame: only a backlog makes a socket slow.
        if self.outbox and self.queued_bytes + len(frame) > CLIENT_BUFFER_BYTES:
            self.hub.evict(self, code=SLOW_CLIENT_CLOSE_CODE)
            return
        self.outbox.append(frame)
        self.queued_bytes += len(frame)
        self._wake.set()

    async def _send_loop(self) -> None:
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                while self.outbox:
                    frame = self.outbox[0]
                    await self.socket.send(text_data=frame)
                    # Counted until sent: a send that waits on the client keeps its frame's weight.
                    self.outbox.popleft()
                    self.queued_bytes -= len(frame)
        except asyncio.CancelledError:
            raise
        except Exception:  # the socket went away mid-send: stop queueing for it
            log.debug("fanout: a send to a socket of run %s failed", self.hub.run_id, exc_info=True)
            self.hub.leave(self)

    def stop(self) -> None:
        self.outbox.clear()
        self.queued_bytes = 0
        if self._sender is not None and self._sender is not asyncio.current_task():
            self._sender.cancel()


class RunFanout:
    """A run's subscription in this process (one event loop): one layer channel in the run's
    stream, one reader task, the local members."""

    def __init__(self, run_id: int) -> None:
        self.run_id = run_id
        self.stream = run_stream_name(run_id)
        self.layer = get_channel_layer()
        self.members: dict[int, Member] = {}
        self.channel: str | None = None
        self.pending: list[LayerMessage] = []
        self.frames_sent = 0
        self._loop = asyncio.get_running_loop()
        self._last_flush = float("-inf")
        self._flush_handle: asyncio.Handle | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._ready = asyncio.ensure_future(self._subscribe())
        self._closed = False

    async def _subscribe(self) -> None:
        if self.layer is None:
            return
        self.channel = await self.layer.new_channel()
        await self.layer.group_add(self.stream, self.channel)
        if self._closed:  # every joiner left while subscribing; _unsubscribe undoes the add
            return
        self._spawn(self._read(), "read")
        self._spawn(self._renew(), "renew")

    def _spawn(self, coro: Coroutine[object, object, None], what: str) -> asyncio.Task[None]:
        task = asyncio.create_task(coro, name=f"fanout-{what}-{self.run_id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _read(self) -> None:
        assert self.layer is not None and self.channel is not None
        try:
            while True:
                message = await self.layer.receive(self.channel)
                self.pending.extend(layer_events(message))
                self._schedule_flush()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                # Stopped (the hub closing, the loop ending) and the layer's receive failed on
                # the way out: there is nothing left to recover, and awaiting more here would
                # hold up whoever is waiting for this task to end.
                raise asyncio.CancelledError from None
            # Events are lost from here on: close every socket so that browsers reconnect
            # (resubscribing) and catch up from the buffer, rather than sit on a dead stream.
            # Redis going away is an outage, not a bug: one line, and "try again later".
            code = RESUBSCRIBE_CLOSE_CODE if isinstance(exc, LAYER_DOWN) else FAILED_CLOSE_CODE
            if code == RESUBSCRIBE_CLOSE_CODE:
                log.warning("fanout: run %s lost its subscription, Redis is unreachable (%s: %s); "
                            "closing its %s socket(s) with %s", self.run_id, type(exc).__name__, exc,
                            len(self.members), code)
            else:
                log.exception("fanout: the subscription of run %s failed; closing its sockets", self.run_id)
            # The layer's pooled connections are as dead as this one was (Redis restarted, or
            # the network dropped): a socket that reconnects must get a subscription on fresh
            # ones. Kept, each of them failed the next subscription once, closing the page again.
            try:
                await self.layer.close_pools()
            except Exception:
                log.debug("fanout: could not reset the channel layer's connections", exc_info=True)
            for member in list(self.members.values()):
                self.evict(member, code=code)

    async def _renew(self) -> None:
        assert self.layer is not None and self.channel is not None
        while True:
            await asyncio.sleep(GROUP_RENEW_SECONDS)
            try:
                await self.layer.group_add(self.stream, self.channel)
            except Exception:
                log.exception("fanout: could not renew run %s's subscription", self.run_id)

    def _schedule_flush(self) -> None:
        if self._flush_handle is not None:
            return
        delay = self._last_flush + FLUSH_INTERVAL - self._loop.time()
        if delay <= 0:
            # call_soon, not a direct flush: whatever else is already readable joins this frame.
            self._flush_handle = self._loop.call_soon(self._flush)
        else:
            self._flush_handle = self._loop.call_later(delay, self._flush)

    def _flush(self) -> None:
        # Synchronous on purpose: no other code runs between encoding and queueing, so every
        # member gets the same frames in the same order.
        self._flush_handle = None
        self._last_flush = self._loop.time()
        events, self.pending = self.pending, []
        for frame in _frames([json.dumps(event) for event in events]):
            self.frames_sent += 1
            for member in list(self.members.values()):
                member.push(frame)

    async def join(self, socket: LiveSocket) -> Member:
        member = Member(self, socket)
        self.members[id(socket)] = member
        try:
            # Shielded: a joiner that is cancelled must not cancel the subscription others wait on.
            await asyncio.shield(self._ready)
        except BaseException:
            self.leave(member)
            raise
        return member

    def evict(self, member: Member, *, code: int) -> None:
        """Drop a member and close its socket with `code` (it is too slow, or the hub failed)."""
        if member.closed_code is not None:
            return
        member.closed_code = code
        log.info("fanout: closing a socket of run %s with code %s", self.run_id, code)
        self.leave(member)
        self._spawn(self._close_socket(member.socket, code), "close")

    async def _close_socket(self, socket: LiveSocket, code: int) -> None:
        try:
            await socket.close(code=code)
        except Exception:
            log.debug("fanout: closing a socket of run %s failed", self.run_id, exc_info=True)

    def leave(self, member: Member) -> asyncio.Future[None] | None:
        """Drop a member; the last one out closes the hub and gets its unsubscribe to await."""
        if self.members.get(id(member.socket)) is member:
            del self.members[id(member.socket)]
        member.stop()
        if not self.members and not self._closed:
            return self._close()
        return None

    def _close(self) -> asyncio.Future[None]:
        # Out of the registry at once, so a socket that joins during the cleanup below starts
        # a fresh subscription instead of joining one that is going away.
        self._closed = True
        hubs = _hubs.get(self._loop)
        if hubs is not None and hubs.get(self.run_id) is self:
            del hubs[self.run_id]
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        self.pending = []
        closing = [t for t in self._tasks if t.get_name().startswith("fanout-close-")]
        for task in list(self._tasks):
            if task not in closing:
                task.cancel()
        # The unsubscribe outlives this hub's tasks; keep a reference until it is done.
        unsubscribe = asyncio.ensure_future(self._unsubscribe())
        _cleanups.add(unsubscribe)
        unsubscribe.add_done_callback(_cleanups.discard)
        return unsubscribe

    async def _unsubscribe(self) -> None:
        try:
            await asyncio.shield(self._ready)
        except Exception:
            return
        if self.layer is not None and self.channel is not None:
            try:
                await self.layer.group_discard(self.stream, self.channel)
            except LAYER_DOWN as exc:
                # Redis is gone (and with it the membership, if it restarted); the member
                # expires on its own otherwise (group_expiry).
                log.info("fanout: could not unsubscribe run %s, Redis is unreachable (%s)", self.run_id, exc)
            except Exception:
                log.exception("fanout: could not unsubscribe run %s", self.run_id)


def _frames(encoded: list[str]) -> list[str]:
    """Encoded events as frames: one event as it is, several as a batch, in order, each batch
    under MAX_FRAME_BYTES (an event larger than that goes alone)."""
    frames: list[str] = []
    chunk: list[str] = []
    size = 0
    for event in encoded + [""]:
        if chunk and (not event or size + len(event) + 1 > MAX_FRAME_BYTES):
            frames.append(chunk[0] if len(chunk) == 1 else '{"type": "batch", "events": [' + ", ".join(chunk) + "]}")
            chunk, size = [], 0
        if event:
            chunk.append(event)
            size += len(event) + 2
    return frames


# Hubs per event loop: a channel layer's connections belong to the loop that opened them,
# and each test (and each server process) runs its own loop.
_hubs: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[int, RunFanout]] = weakref.WeakKeyDictionary()
_cleanups: set[asyncio.Future[None]] = set()


async def fanout_join(*, run_id: int, socket: LiveSocket) -> Member:
    """Subscribe `socket` to the run's events in this process, subscribing the process to the
    run's stream if it is the first. Call after checking the user may view the run and before
    accept(); call `member.start()` after accept() and `fanout_leave` on disconnect."""
    loop = asyncio.get_running_loop()
    hubs = _hubs.setdefault(loop, {})
    hub = hubs.get(run_id)
    if hub is None:
        hub = hubs[run_id] = RunFanout(run_id)
    return await hub.join(socket)


async def fanout_leave(*, member: Member) -> None:
    """Take the socket out of its run's hub; the last one out unsubscribes the process (and
    waits for it, so that a server or a test that stops next leaves no member behind)."""
    unsubscribe = member.hub.leave(member)
    if unsubscribe is not None:
        await asyncio.shield(unsubscribe)


def fanout_hub(*, run_id: int) -> RunFanout | None:
    """This process's hub for the run, if any socket is subscribed (for tests and diagnostics)."""
    try:
        return _hubs.get(asyncio.get_running_loop(), {}).get(run_id)
    except RuntimeError:
        return None
