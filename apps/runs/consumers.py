"""The run's live event stream for the browser, and the runs list's live refresh.

Both follow their person's access after the handshake (apps/runs/socket_access.py): a socket
whose person lost it (removed from the run, deactivated, logged out, password changed) is
closed with 4403. A handshake while the channel layer's Redis is unreachable is accepted and
closed at once with 1013 (try again later), which the pages answer by reconnecting; never a 500.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, ParamSpec, TypedDict, TypeVar

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from apps.runs.events import RUNS_LIST_STREAM
from apps.runs.fanout import Member, fanout_join, fanout_leave
from apps.runs.models import Run
from apps.runs.selectors import run_can_view, runs_visible_to
from apps.runs.socket_access import ACCESS_LOST_CLOSE_CODE, access_guard, access_unguard, session_user
from rftweb.degrade import REDIS_ERRORS, TRY_AGAIN_CLOSE_CODE
from rftweb.request_guard import Receive, Scope, Send
from kernel.exceptions import Unavailable

if TYPE_CHECKING:
    from django.contrib.auth.models import AbstractBaseUser, AnonymousUser

log = logging.getLogger(__name__)

# TRY_AGAIN_CLOSE_CODE (rftweb/degrade.py), for a handshake refused because a service it
# needs is unreachable: "try again later" (RFC 6455's 1013); the pages reconnect on any code
# but 4403.
# What a socket's handshake may meet when the channel layer's Redis is gone: redis-py's
# errors, the sockets' own (ConnectionRefusedError, from channels_redis's pool), our timeout.
LAYER_DOWN: tuple[type[Exception], ...] = (*REDIS_ERRORS, OSError, Unavailable)

P = ParamSpec("P")
R = TypeVar("R")


def _in_db_thread(fn: Callable[P, R]) -> Callable[P, Awaitable[R]]:
    """channels' database_sync_to_async, typed (channels ships no types): `fn` runs in the
    sync thread with Django's connection handling, and is awaited."""
    wrapped: Callable[P, Awaitable[R]] = database_sync_to_async(fn)
    return wrapped


def _session_key(socket: AsyncJsonWebsocketConsumer) -> str | None:
    session = socket.scope.get("session")
    return getattr(session, "session_key", None) if session is not None else None


@_in_db_thread
def _still_may_view(session_key: str | None, user_id: int | None, run_id: int | None) -> bool:
    """Whether a request with this session would still be `user_id`'s and (with `run_id`)
    still see the run: the socket's re-check."""
    if user_id is None:
        return False
    if session_key is None:
        # A scope whose user was set without a session (channels' test communicator, or a
        # middleware of our own): the account itself, still active.
        from django.contrib.auth import get_user_model

        found = get_user_model().objects.filter(pk=user_id, is_active=True).first()
        if found is None:
            return False
        user: AbstractBaseUser | AnonymousUser = found
    else:
        user = session_user(session_key)
    if not user.is_authenticated or user.pk != user_id:
        return False
    if run_id is None:
        return True
    run = Run.objects.filter(pk=run_id).first()
    return run is not None and run_can_view(run=run, user=user)


class _Guarded(AsyncJsonWebsocketConsumer):  # type: ignore[misc]  # channels ships no types: its consumer is Any to mypy
    """A consumer whose access is re-checked while it is open (socket_access.GuardedSocket)."""

    guarded_run_id: int | None = None
    guarded = False
    # "new" until the handshake is answered, then "open", and "closed" once closed by us.
    state = "new"

    async def accept(self, subprotocol: str | None = None, headers: object = None) -> None:
        self.state = "open"
        await super().accept(subprotocol, headers)

    async def close(self, code: int | None = None, reason: str | None = None) -> None:
        self.state = "closed"
        await super().close(code, reason)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        except LAYER_DOWN as exc:
            await self.layer_lost(exc)

    async def layer_lost(self, exc: BaseException) -> None:
        """The socket's own layer channel failed (Redis went away while it was open, or before
        its handshake was answered): closed with 1013 and one log line, which the page answers
        by reconnecting, instead of the server's 1011 and a traceback."""
        if self.state == "new":
            await self.refuse_for_now(exc)
            return
        await self.unguard()
        if self.state == "open":
            log.warning("websocket %s closed with %s: the channel layer is unreachable (%s: %s)",
                        self.scope.get("path"), TRY_AGAIN_CLOSE_CODE, type(exc).__name__, exc)
            await self.close(code=TRY_AGAIN_CLOSE_CODE)

    @property
    def access_user_id(self) -> int | None:
        user = self.scope.get("user")
        return getattr(user, "pk", None)

    async def access_holds(self) -> bool:
        holds: bool = await _still_may_view(_session_key(self), self.access_user_id, self.guarded_run_id)
        return holds

    async def access_lost(self) -> None:
        await self.access_end()
        await self.close(code=ACCESS_LOST_CLOSE_CODE)

    async def access_end(self) -> None:
        """Stop what the socket receives (subclasses leave their streams)."""

    async def guard(self) -> None:
        await access_guard(socket=self)
        self.guarded = True

    async def unguard(self) -> None:
        if self.guarded:
            self.guarded = False
            await access_unguard(socket=self)

    async def refuse_for_now(self, exc: BaseException) -> None:
        """The channel layer is unreachable: accepted and closed at once with 1013, so that
        the page sees a close code it retries on (a refused handshake reads as 1006)."""
        log.warning("websocket %s refused for now: the channel layer is unreachable (%s)", self.scope.get("path"), exc)
        await self.unguard()
        await self.accept()
        await self.close(code=TRY_AGAIN_CLOSE_CODE)


@_in_db_thread
def _may_view(run_id: int, user: AbstractBaseUser | AnonymousUser) -> bool:
    run = Run.objects.filter(pk=run_id).first()
    return run is not None and run_can_view(run=run, user=user)


async def run_socket_admit(socket: AsyncJsonWebsocketConsumer) -> int | None:
    """The run id of the socket's URL when its user may view that run; else the socket is
    closed (4403, the same for a missing run) and None."""
    run_id = int(socket.scope["url_route"]["kwargs"]["run_id"])
    user = socket.scope.get("user")
    if user is None or not await _may_view(run_id, user):
        await socket.close(code=4403)
        return None
    return run_id


@_in_db_thread
def _visible_ids(user: AbstractBaseUser | AnonymousUser) -> set[int]:
    return set(runs_visible_to(user=user).values_list("pk", flat=True))


class RunEventsConsumer(_Guarded):
    """Checks the user may view the run, then joins this process's subscription to the run's
    stream `run.<id>` (apps/runs/fanout.py), which sends each event to every local socket of
    the run; closed with 4403 once the user may view it no longer."""

    # No channel of its own: the process's hub is the stream's only member, so a socket costs
    # no layer channel (a Redis subscription on the pub/sub layer, a receive task on core).
    channel_layer_alias = "rftweb.no-layer-per-socket"
    member: Member | None = None

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=ACCESS_LOST_CLOSE_CODE)
            return
        try:
            # Watched before the check: access that ends after the check is told to the watch.
            await self.guard()
            run_id = await run_socket_admit(self)
            if run_id is None:
                await self.unguard()
                return
            self.guarded_run_id = run_id
            # Subscribed before the handshake completes, so nothing published after the client
            # sees "open" is missed; frames wait in the member's outbox until start().
            self.member = await fanout_join(run_id=run_id, socket=self)
        except LAYER_DOWN as exc:
            await self.refuse_for_now(exc)
            return
        await self.accept()
        self.member.start()

    async def access_end(self) -> None:
        if self.member is not None:
            member, self.member = self.member, None
            await fanout_leave(member=member)

    async def disconnect(self, code: int) -> None:
        await self.unguard()
        await self.access_end()

    async def receive_json(self, content: object, **kwargs: object) -> None:
        # The stream is one-way; a ping gets a pong so clients can measure the link.
        if isinstance(content, dict) and content.get("type") == "ping":
            await self.send_json({"type": "pong", "payload": content.get("payload")})


class RunsChanged(TypedDict):
    """The `runs` stream's message: run N changed (apps.runs.events.runs_list_touch)."""

    type: str
    run: int


class RunsListConsumer(_Guarded):
    """The runs list's live refresh. A signed-in user's socket joins the `runs` stream, which
    carries only "run N changed" (apps.runs.events.runs_list_touch); a notice goes on to the
    browser only when the user may view run N, as `{"type": "runs.changed", "payload":
    {"run": N}}`, and the page then fetches its rows over HTTP, filtered as every page is.
    A few list pages per team: one layer channel per socket is cheap here."""

    shown: set[int]

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=4403)
            return
        try:
            await self.guard()
            # The runs this list shows: a run taken from the user (staffing) is told once more,
            # so that the page drops its row.
            self.shown = await _visible_ids(user)
            await self.channel_layer.group_add(RUNS_LIST_STREAM, self.channel_name)
        except LAYER_DOWN as exc:
            await self.refuse_for_now(exc)
            return
        await self.accept()

    async def access_end(self) -> None:
        try:
            await self.channel_layer.group_discard(RUNS_LIST_STREAM, self.channel_name)
        except LAYER_DOWN:
            pass  # the stream's membership expires on its own

    async def disconnect(self, code: int) -> None:
        await self.unguard()
        await self.access_end()

    async def runs_changed(self, event: RunsChanged) -> None:
        run_id = int(event["run"])
        # Asked each time: a run's people change while the list is open.
        if await _may_view(run_id, self.scope["user"]):
            self.shown.add(run_id)
        elif run_id in self.shown:
            self.shown.discard(run_id)
        else:
            return
        await self.send_json({"type": "runs.changed", "payload": {"run": run_id}})
