"""The run's live event stream for the browser."""

from __future__ import annotations

from typing import TYPE_CHECKING, TypedDict

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from apps.runs.events import RUNS_LIST_GROUP
from apps.runs.fanout import Member, fanout_join, fanout_leave
from apps.runs.models import Run
from apps.runs.selectors import run_can_view, runs_visible_to

if TYPE_CHECKING:
    from django.contrib.auth.models import AbstractBaseUser, AnonymousUser


@database_sync_to_async
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


@database_sync_to_async
def _visible_ids(user: AbstractBaseUser | AnonymousUser) -> set[int]:
    return set(runs_visible_to(user=user).values_list("pk", flat=True))


class RunEventsConsumer(AsyncJsonWebsocketConsumer):
    """Checks the user may view the run, then joins this process's subscription to `run.<id>`
    (apps/runs/fanout.py), which sends each event to every local socket of the run."""

    # No channel of its own: the process's hub is the only group member, so a socket costs
    # no layer channel (a Redis subscription on the pub/sub layer, a receive task on core).
    channel_layer_alias = "rftweb.no-layer-per-socket"
    member: Member | None = None

    async def connect(self) -> None:
        run_id = await run_socket_admit(self)
        if run_id is None:
            return
        # Subscribed before the handshake completes, so nothing published after the client
        # sees "open" is missed; frames wait in the member's outbox until start().
        self.member = await fanout_join(run_id=run_id, socket=self)
        await self.accept()
        self.member.start()

    async def disconnect(self, code: int) -> None:
        if self.member is not None:
            await fanout_leave(member=self.member)
            self.member = None

    async def receive_json(self, content: object, **kwargs: object) -> None:
        # The stream is one-way; a ping gets a pong so clients can measure the link.
        if isinstance(content, dict) and content.get("type") == "ping":
            await self.send_json({"type": "pong", "payload": content.get("payload")})


class RunsChanged(TypedDict):
    """The `runs` group's message: run N changed (apps.runs.events.runs_list_touch)."""

    type: str
    run: int


class RunsListConsumer(AsyncJsonWebsocketConsumer):
    """The runs list's live refresh. A signed-in user's socket joins the `runs` group, which
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
        # The runs this list shows: a run taken from the user (staffing) is told once more,
        # so that the page drops its row.
        self.shown = await _visible_ids(user)
        await self.channel_layer.group_add(RUNS_LIST_GROUP, self.channel_name)
        await self.accept()

    async def disconnect(self, code: int) -> None:
        await self.channel_layer.group_discard(RUNS_LIST_GROUP, self.channel_name)

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
