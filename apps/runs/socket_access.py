"""Open sockets follow their person's access as it changes.

A socket is admitted once, at its handshake; access can end afterwards in many ways: the
owner removes the member, staff deactivate the account or take away staff, the person logs
out, or changes their password (which ends their other sessions). Each of those is told to
every web process as one notice on the channel layer's ACCESS_STREAM
(apps.runs.events.access_changed_publish, sent by apps/runs/access_signals.py). Here, each
event loop that holds guarded sockets subscribes to that stream once; a notice re-checks the
sockets of the person it names, and a socket that no longer passes its own check is closed
(4403, which the pages take as "not allowed", not as a reason to reconnect).

The re-check is the socket's own (`access_holds`): its session read afresh from the session
store through Django's `get_user` (a deleted session, an inactive account or a password hash
that changed all come back anonymous, exactly as the next HTTP request would), then the
run's view rule. A notice lost with Redis, or a change made without signals (a bulk UPDATE,
a session that expired) is caught by a sweep of every socket each ACCESS_SWEEP_SECONDS.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Coroutine
from importlib import import_module
from types import SimpleNamespace
from typing import TYPE_CHECKING, Protocol

from channels.layers import get_channel_layer
from django.conf import settings

from apps.runs.events import ACCESS_STREAM, ACCESS_NOTICE
from kernel.exceptions import Unavailable

if TYPE_CHECKING:
    from django.contrib.auth.models import AbstractBaseUser, AnonymousUser

log = logging.getLogger(__name__)

# The application close code for "no longer allowed": the pages stop and say so.
ACCESS_LOST_CLOSE_CODE = 4403
# How long a failed subscription to the access stream waits before it is tried again.
RESUBSCRIBE_SECONDS = 2.0
# How long a socket's handshake waits for its loop's subscription before it is refused as
# "try again" (the channel layer's Redis is unreachable).
SUBSCRIBE_WAIT_SECONDS = 5.0


class GuardedSocket(Protocol):
    """What the watch needs of a socket: whose it is, its own check, and how it ends."""

    @property
    def access_user_id(self) -> int | None: ...

    async def access_holds(self) -> bool: ...

    async def access_lost(self) -> None: ...


def session_user(session_key: str | None) -> AbstractBaseUser | AnonymousUser:
    """The user a request with this session key would be now (sync: run it in a thread):
    the session read afresh, through Django's own `get_user` (backend, active flag, and the
    password's session hash)."""
    from django.contrib.auth import get_user
    from django.contrib.auth.models import AnonymousUser

    if not session_key:
        return AnonymousUser()
    store = import_module(settings.SESSION_ENGINE).SessionStore(session_key)
    return get_user(SimpleNamespace(session=store))  # type: ignore[arg-type]  # get_user reads request.session only


class AccessWatch:
    """This event loop's guarded sockets by user, one subscription to ACCESS_STREAM and the sweep."""

    def __init__(self) -> None:
        self.sockets: dict[int | None, set[GuardedSocket]] = {}
        self.layer = get_channel_layer()
        self.channel: str | None = None
        self.checks = 0  # sockets re-checked (for tests and diagnostics)
        self._tasks: set[asyncio.Task[None]] = set()
        self._subscribed = asyncio.Event()
        self._spawn(self._read(), "read")
        self._spawn(self._sweep(), "sweep")

    def _spawn(self, coro: Coroutine[object, object, None], what: str) -> None:
        task = asyncio.create_task(coro, name=f"access-watch-{what}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def add(self, socket: GuardedSocket) -> None:
        self.sockets.setdefault(socket.access_user_id, set()).add(socket)

    def discard(self, socket: GuardedSocket) -> None:
        held = self.sockets.get(socket.access_user_id)
        if held is not None:
            held.discard(socket)
            if not held:
                del self.sockets[socket.access_user_id]

    def empty(self) -> bool:
        return not self.sockets

    async def subscribed(self) -> None:
        """Returns once notices reach this loop (at once without a channel layer)."""
        await self._subscribed.wait()

    async def _read(self) -> None:
        if self.layer is None:
            self._subscribed.set()
            return
        while True:
            try:
                self.channel = await self.layer.new_channel()
                await self.layer.group_add(ACCESS_STREAM, self.channel)
                self._subscribed.set()
                while True:
                    message = await self.layer.receive(self.channel)
                    if message.get("type") == ACCESS_NOTICE:
                        self._spawn(self.recheck(message.get("user")), "recheck")
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                # Redis gone: the sweep goes on meanwhile; subscribe again when it is back.
                log.warning("access watch: the subscription to %s failed (%s: %s); retrying in %g s",
                            ACCESS_STREAM, type(exc).__name__, exc, RESUBSCRIBE_SECONDS)
                self._subscribed.clear()
                await asyncio.sleep(RESUBSCRIBE_SECONDS)

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(settings.RFT_SOCKET_ACCESS_SECONDS)
            await self.recheck(None)

    async def recheck(self, user_id: int | None) -> None:
        """Re-check the sockets of `user_id` (None: every socket) and end those that fail."""
        if user_id is None:
            targets = [s for held in self.sockets.values() for s in held]
        else:
            targets = list(self.sockets.get(user_id, ()))
        for socket in targets:
            self.checks += 1
            try:
                holds = await socket.access_holds()
            except Exception:  # the database cannot answer now: the next notice or sweep decides
                log.warning("access watch: could not re-check a socket of user %s", user_id, exc_info=True)
                continue
            if not holds:
                self.discard(socket)
                await socket.access_lost()

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self.layer is not None and self.channel is not None:
            try:
                await self.layer.group_discard(ACCESS_STREAM, self.channel)
            except Exception:
                log.debug("access watch: could not leave %s", ACCESS_STREAM, exc_info=True)


_watches: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AccessWatch] = weakref.WeakKeyDictionary()


async def access_guard(*, socket: GuardedSocket) -> AccessWatch:
    """Watch `socket`'s access from now on (call before accept(): a notice sent once the
    client sees the socket open reaches it); `access_unguard` on disconnect."""
    loop = asyncio.get_running_loop()
    watch = _watches.get(loop)
    if watch is None:
        watch = _watches[loop] = AccessWatch()
    watch.add(socket)
    try:
        await asyncio.wait_for(watch.subscribed(), timeout=SUBSCRIBE_WAIT_SECONDS)
    except TimeoutError:
        await access_unguard(socket=socket)
        raise Unavailable(f"the channel layer took no subscription within {SUBSCRIBE_WAIT_SECONDS:g} s") from None
    return watch


async def access_unguard(*, socket: GuardedSocket) -> None:
    """Stop watching `socket`; the loop's last one out ends the subscription."""
    loop = asyncio.get_running_loop()
    watch = _watches.get(loop)
    if watch is None:
        return
    watch.discard(socket)
    if watch.empty() and _watches.get(loop) is watch:
        del _watches[loop]
        await watch.close()

