"""The live stream's per-process hub (apps/runs/fanout.py): one stream membership per run per
process however many sockets watch it, events in order in single or batch frames, slow
sockets closed instead of buffered without bound, and a clean unsubscribe. Real Redis."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import pytest
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import User

from apps.runs import fanout
from apps.runs.events import event_publish_async, run_stream_name
from apps.runs.fanout import SLOW_CLIENT_CLOSE_CODE, fanout_hub, fanout_join, fanout_leave
from apps.runs.models import Run
from tests.conftest import run_socket_connect
from tests.servers import EVENT_WAIT_S

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
async def no_stale_members(run: Run) -> None:
    # Run ids restart with each test database; a killed earlier session may have left members.
    layer = get_channel_layer()
    await layer.connection(layer.consistent_hash(run_stream_name(run.pk))).delete(layer._group_key(run_stream_name(run.pk)))


async def _events(comm: WebsocketCommunicator, count: int, frames: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Read frames until `count` events came; batch frames are unpacked in order."""
    events: list[dict[str, Any]] = []
    while len(events) < count:
        frame = await comm.receive_json_from(timeout=EVENT_WAIT_S)
        if frames is not None:
            frames.append(frame)
        events.extend(frame["events"] if frame["type"] == "batch" else [frame])
    return events


async def _stream_members(run: Run) -> list[bytes]:
    layer = get_channel_layer()
    connection = layer.connection(layer.consistent_hash(run_stream_name(run.pk)))
    return await connection.zrange(layer._group_key(run_stream_name(run.pk)), 0, -1)


async def _until(predicate: Any, timeout: float = EVENT_WAIT_S) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await predicate():
        assert loop.time() < deadline, "timed out waiting"
        await asyncio.sleep(0.02)


async def test_sockets_of_a_run_in_one_process_share_one_stream_membership(run: Run, owner: User, annotator: User) -> None:
    comms = [(await run_socket_connect(run, user))[0] for user in (owner, annotator, owner)]
    assert len(await _stream_members(run)) == 1
    await event_publish_async(run_id=run.pk, type="weights.synced", payload={"version": 2})
    for comm in comms:
        assert await comm.receive_json_from(timeout=EVENT_WAIT_S) == {"type": "weights.synced", "payload": {"version": 2}}
    for comm in comms:
        await comm.disconnect()


async def test_the_last_socket_to_leave_unsubscribes_the_process(run: Run, owner: User) -> None:
    first, _ = await run_socket_connect(run, owner)
    second, _ = await run_socket_connect(run, owner)
    await first.disconnect()
    assert fanout_hub(run_id=run.pk) is not None and len(await _stream_members(run)) == 1
    await second.disconnect()
    assert fanout_hub(run_id=run.pk) is None

    async def unsubscribed() -> bool:
        return await _stream_members(run) == []

    await _until(unsubscribed)
    # A socket that comes back subscribes afresh and receives again.
    again, _ = await run_socket_connect(run, owner)
    await event_publish_async(run_id=run.pk, type="run.status", payload={"status": "running"})
    assert await again.receive_json_from(timeout=EVENT_WAIT_S) == {"type": "run.status", "payload": {"status": "running"}}
    await again.disconnect()


async def test_a_refused_socket_does_not_subscribe_the_process(run: Run, outsider: User) -> None:
    _, connected = await run_socket_connect(run, outsider)
    assert not connected
    assert fanout_hub(run_id=run.pk) is None and await _stream_members(run) == []


async def test_a_burst_reaches_every_socket_in_order_in_fewer_frames(run: Run, owner: User, annotator: User,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # A long flush interval makes the batching certain however slow the machine is.
    monkeypatch.setattr(fanout, "FLUSH_INTERVAL", 0.3)
    comms = [(await run_socket_connect(run, user))[0] for user in (owner, annotator)]
    for seq in range(60):
        await event_publish_async(run_id=run.pk, type="experience.created", payload={"ids": [seq], "seq": seq})
    for comm in comms:
        frames: list[dict[str, Any]] = []
        events = await _events(comm, 60, frames)
        assert [e["payload"]["seq"] for e in events] == list(range(60))
        assert all(e["type"] == "experience.created" for e in events)
        assert len(frames) < 60 and any(f["type"] == "batch" for f in frames)
        await comm.disconnect()


async def test_a_burst_beyond_the_old_capacity_waiting_in_redis_reaches_every_socket(
        run: Run, owner: User, annotator: User) -> None:
    """1,500 layer messages pile up in the process's channel while its event loop is busy
    (blocked here): every one arrives, in order. channels_redis dropped those past its
    capacity (1,000 before) or older than its expiry (30 s), silently, and read one message
    per four round trips (bench/web_load: owners missed whole seconds of events)."""
    import redis
    from django.conf import settings

    from apps.runs.events import event_publish

    burst = 1500
    assert burst > 1000
    comms = [(await run_socket_connect(run, user))[0] for user in (owner, annotator)]
    # Synchronous publishes from this loop's thread: the hub's reader cannot run meanwhile,
    # so the whole burst waits in Redis, one layer message an event.
    layer = get_channel_layer()
    hub = fanout_hub(run_id=run.pk)
    assert hub is not None and hub.channel is not None
    for seq in range(burst):
        event_publish(run_id=run.pk, type="run.metric", payload={"seq": seq})
    # Still without yielding to the loop: what waits in the process's channel (the reader's
    # pending BZPOPMIN may have taken the first).
    waiting = redis.Redis.from_url(settings.REDIS_URL).zcard(layer.prefix + layer.non_local_name(hub.channel))
    assert waiting >= burst - 1, waiting
    for comm in comms:
        events = await _events(comm, burst)
        assert [e["payload"]["seq"] for e in events] == list(range(burst))
        await comm.disconnect()


class StalledSocket:
    """A socket whose client stopped reading: a send never completes (as under a server that
    applies backpressure)."""

    def __init__(self) -> None:
        self.sent: list[str] = []
        self.closed_with: int | None = None
        self.closed = asyncio.Event()

    async def send(self, text_data: str | None = None, bytes_data: bytes | None = None, close: bool = False) -> None:
        self.sent.append(text_data or "")
        await asyncio.Event().wait()

    async def close(self, code: int | None = None, reason: str | None = None) -> None:
        self.closed_with = code
        self.closed.set()


async def test_a_socket_that_does_not_keep_up_is_closed_and_the_others_miss_nothing(
    run: Run, owner: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fanout, "CLIENT_BUFFER_BYTES", 4000)
    monkeypatch.setattr(fanout, "FLUSH_INTERVAL", 0.0)
    healthy, _ = await run_socket_connect(run, owner)
    stalled = StalledSocket()
    member = await fanout_join(run_id=run.pk, socket=stalled)
    member.start()
    peak = 0
    for seq in range(100):
        await event_publish_async(run_id=run.pk, type="experience.created", payload={"seq": seq, "text": "x" * 100})
        peak = max(peak, member.queued_bytes)
    await asyncio.wait_for(stalled.closed.wait(), timeout=EVENT_WAIT_S)
    assert stalled.closed_with == SLOW_CLIENT_CLOSE_CODE
    assert peak <= 4000 and member.queued_bytes == 0 and not member.outbox
    hub = fanout_hub(run_id=run.pk)
    assert hub is None or member not in hub.members.values()
    events = await _events(healthy, 100)
    assert [e["payload"]["seq"] for e in events] == list(range(100))
    await fanout_leave(member=member)  # what its consumer's disconnect() does: harmless twice
    await healthy.disconnect()
    assert fanout_hub(run_id=run.pk) is None


async def test_frames_are_encoded_once_for_all_sockets(run: Run, owner: User) -> None:
    first, _ = await run_socket_connect(run, owner)
    second, _ = await run_socket_connect(run, owner)
    hub = fanout_hub(run_id=run.pk)
    await event_publish_async(run_id=run.pk, type="run.metric", payload={"loss": 0.5})
    one = await first.receive_from(timeout=EVENT_WAIT_S)
    two = await second.receive_from(timeout=EVENT_WAIT_S)
    assert one == two and json.loads(one) == {"type": "run.metric", "payload": {"loss": 0.5}}
    assert hub is not None and hub.frames_sent == 1
    await first.disconnect()
    await second.disconnect()


async def test_a_backlog_goes_out_as_several_frames_under_the_size_bound_in_order(
    run: Run, owner: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fanout, "FLUSH_INTERVAL", 0.3)
    monkeypatch.setattr(fanout, "MAX_FRAME_BYTES", 1000)
    comm, _ = await run_socket_connect(run, owner)
    for seq in range(30):
        await event_publish_async(run_id=run.pk, type="experience.created", payload={"seq": seq, "text": "y" * 150})
    frames: list[dict[str, Any]] = []
    events = await _events(comm, 30, frames)
    assert [e["payload"]["seq"] for e in events] == list(range(30))
    batches = [f for f in frames if f["type"] == "batch"]
    assert batches and all(len(json.dumps(f)) <= 1000 for f in batches)
    await comm.disconnect()


async def test_a_large_event_reaches_a_socket_that_is_keeping_up(run: Run, owner: User,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # Only a backlog makes a socket slow: one frame bigger than the allowance is still sent.
    monkeypatch.setattr(fanout, "CLIENT_BUFFER_BYTES", 1000)
    comm, _ = await run_socket_connect(run, owner)
    await event_publish_async(run_id=run.pk, type="experience.created", payload={"text": "z" * 5000})
    assert (await comm.receive_json_from(timeout=EVENT_WAIT_S))["payload"]["text"] == "z" * 5000
    await comm.disconnect()


@pytest.fixture
def private_redis(settings: Any, tmp_path: Any) -> Any:
    """The channel layer on a Redis of this test's own, which it may restart."""
    from channels.layers import channel_layers

    from tests.servers import Redis

    redis = Redis(tmp_path / "redis")
    redis.start()
    layers = json.loads(json.dumps(settings.CHANNEL_LAYERS))
    layers["default"]["CONFIG"]["hosts"][0]["address"] = redis.url
    settings.CHANNEL_LAYERS = layers
    channel_layers.backends.clear()
    try:
        yield redis
    finally:
        redis.stop()
        channel_layers.backends.clear()


async def test_after_a_redis_restart_a_live_page_is_told_to_reconnect_and_then_gets_events_again(
    run: Run, owner: User, private_redis: Any
) -> None:
    """Redis keeps nothing on disk: a restart forgets the process's stream membership. A
    stream that silently stopped would leave a page showing stale state; instead the socket
    is closed with RESUBSCRIBE_CLOSE_CODE (the pages reconnect on close), and the new socket
    resubscribes against the restarted Redis."""
    comm, connected = await run_socket_connect(run, owner)
    assert connected
    await event_publish_async(run_id=run.pk, type="weights.synced", payload={"version": 1})
    assert [e["payload"] for e in await _events(comm, 1)] == [{"version": 1}]

    await asyncio.to_thread(private_redis.restart)
    closed = await comm.receive_output(timeout=EVENT_WAIT_S)
    assert closed == {"type": "websocket.close", "code": fanout.RESUBSCRIBE_CLOSE_CODE}
    await comm.wait()

    # A page reconnects whenever it is told to. Under load a second subscription right after
    # the restart has once failed too (its first read found its connection closed) and told
    # the new socket to reconnect again: allowed, as long as it says so and a later one gets
    # the events.
    for attempt in range(3):
        again, connected = await run_socket_connect(run, owner)
        assert connected
        await event_publish_async(run_id=run.pk, type="weights.synced", payload={"version": 2 + attempt})
        first = await again.receive_output(timeout=EVENT_WAIT_S)
        if first["type"] == "websocket.close":
            assert first["code"] == fanout.RESUBSCRIBE_CLOSE_CODE, first
            await again.wait()
            continue
        frame = json.loads(first["text"])
        events = frame["events"] if frame["type"] == "batch" else [frame]
        assert [e["payload"] for e in events] == [{"version": 2 + attempt}]
        await again.disconnect()
        break
    else:
        raise AssertionError("three reconnects after the restart and no events")


async def test_the_first_event_published_after_a_redis_restart_is_not_dropped(run: Run, private_redis: Any) -> None:
    """A publisher's pooled connection dies with Redis; the first event it sent after the
    restart failed on it and was dropped (issue 66). It is sent again on a fresh connection."""
    from apps.runs.events import event_publish

    layer = get_channel_layer()
    # The process's publisher opens its connection before the restart (heartbeats: no runs-list notice).
    await asyncio.to_thread(event_publish, run_id=run.pk, type="worker.heartbeat", payload={"n": 0})
    await asyncio.to_thread(private_redis.restart)
    channel = await layer.new_channel()
    await layer.group_add(run_stream_name(run.pk), channel)  # the restart forgot every membership
    for n in (1, 2):
        await asyncio.to_thread(event_publish, run_id=run.pk, type="worker.heartbeat", payload={"n": n})
    first = await asyncio.wait_for(layer.receive(channel), EVENT_WAIT_S)
    assert first["payload"] == {"n": 1}, first


async def test_sockets_open_when_redis_stops_are_told_to_try_again_in_one_line_each(
    run: Run, owner: User, private_redis: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A live page and a runs list open when Redis goes away: each is closed with 1013 (try
    again later, which the pages reconnect on), logged as one line without a traceback; not
    the server's 1011 with the layer's traceback (issue 66)."""
    from apps.runs.consumers import RunsListConsumer

    live, connected = await run_socket_connect(run, owner)
    assert connected
    listing = WebsocketCommunicator(RunsListConsumer.as_asgi(), "/ws/runs/")
    listing.scope["user"] = owner
    connected, _ = await listing.connect(timeout=30)
    assert connected
    caplog.set_level(logging.WARNING)

    await asyncio.to_thread(private_redis.stop)
    for comm in (live, listing):
        closed = await comm.receive_output(timeout=EVENT_WAIT_S)
        assert closed == {"type": "websocket.close", "code": 1013}, closed
        await comm.wait()
    warned = [r for r in caplog.records if r.levelno >= logging.WARNING]
    # One line per socket (the process's access watch says once that it retries), no traceback.
    per_socket = [r.getMessage() for r in warned if r.name in ("apps.runs.fanout", "apps.runs.consumers")]
    assert len(per_socket) == 2 and all("unreachable" in m for m in per_socket), [r.getMessage() for r in warned]
    assert all(r.exc_info is None for r in warned) and "Traceback" not in caplog.text


def test_closing_the_layer_s_pools_touches_only_the_running_loop_s_connections(settings: Any) -> None:
    """A thread's loop (a sync caller's `async_to_sync`) has its own connection on the same layer;
    the hub's reset after a failure closes this loop's and returns, and the other loop's still
    works. channels_redis closed every loop's from here: an await that never returned (a
    teardown hung 15 min), so the check runs in a thread of its own that must end."""
    import threading

    from rftweb.layers import RedisBatchChannelLayer

    layer = RedisBatchChannelLayer(hosts=[settings.REDIS_URL], prefix="rftweb-test-pools")
    other = asyncio.new_event_loop()
    looping = threading.Thread(target=other.run_forever, daemon=True)
    looping.start()

    async def ping() -> bool:
        return bool(await layer.connection(0).ping())

    def in_other(coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, other).result(timeout=EVENT_WAIT_S)

    async def check() -> None:
        assert in_other(ping()) and await ping()
        await layer.close_pools()
        # The thread's connection was left alone and still answers; this loop opens a fresh one.
        assert in_other(ping()) and await ping()
        await layer.close_pools()

    outcome: list[BaseException | None] = []

    def checking() -> None:
        try:
            asyncio.run(check())
            outcome.append(None)
        except BaseException as error:  # reported below, in the test's thread
            outcome.append(error)

    checker = threading.Thread(target=checking, daemon=True)
    checker.start()
    checker.join(timeout=EVENT_WAIT_S)
    assert outcome, "closing this loop's pools never returned"
    if outcome[0] is not None:
        raise outcome[0]
    in_other(layer.close_pools())
    other.call_soon_threadsafe(other.stop)
    looping.join(timeout=EVENT_WAIT_S)
    other.close()


async def test_a_receive_cancelled_at_any_moment_ends(settings: Any) -> None:
    """A consumer's socket closes: channels cancels its layer receive, which must end. Stock
    channels_redis 4.3 over redis-py 8.1 swallowed a cancel that came 0.5-2 ms after the receive
    began in a quarter of tries (52 of 200) and then waited for ever; a test's event loop hung at
    its close for pytest-timeout's 900 s (2026-11-27). rftweb.layers passes the cancel on until
    the receive has ended: none of 500 hung."""
    from rftweb.layers import RedisBatchChannelLayer, cancelled_until_done

    layer = RedisBatchChannelLayer(hosts=[settings.REDIS_URL], prefix="rftweb-test-cancel")
    layer.brpop_timeout = 0.02  # a BZPOPMIN's turn every 20 ms: more of the moments a cancel can land on
    try:
        for attempt in range(80):
            receive = asyncio.ensure_future(layer.receive(await layer.new_channel()))
            await asyncio.sleep(0.0005 * (1 + attempt % 4))
            receive.cancel()
            done, _ = await asyncio.wait([receive], timeout=EVENT_WAIT_S)
            if not done:  # end it for the loop's close, then fail
                await cancelled_until_done(receive, every=1)
            assert done and receive.cancelled(), f"cancel {attempt} did not end the receive"
    finally:
        await layer.close_pools()


async def test_a_reader_whose_receive_fails_while_it_is_stopped_ends_without_the_reset(
    run: Run, owner: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hub's reader is cancelled (its last socket left, or the loop is ending) and the
    layer's receive raises on the way out: the reader ends at once, cancelled, and does not
    start the reset meant for a live failure (which awaits the layer and closes sockets)."""
    layer = get_channel_layer()
    resets: list[str] = []

    async def receive_failing_when_cancelled(channel: str) -> dict[str, Any]:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            raise RuntimeError("the receive's clean-up failed") from None
        raise AssertionError("unreachable")

    async def reset() -> None:
        resets.append("close_pools")

    monkeypatch.setattr(layer, "receive", receive_failing_when_cancelled)
    monkeypatch.setattr(layer, "close_pools", reset)
    comm, _ = await run_socket_connect(run, owner)
    assert fanout_hub(run_id=run.pk) is not None
    # A join returns once the hub has subscribed, and subscribing starts the reader (a task of
    # this test's loop, found by its name rather than through the hub's private set).
    [reader] = [t for t in asyncio.all_tasks() if t.get_name() == f"fanout-read-{run.pk}"]
    reader.cancel()
    done, _ = await asyncio.wait([reader], timeout=EVENT_WAIT_S)
    assert done == {reader} and reader.cancelled() and resets == []
    await comm.disconnect()
