"""Live events: typed events on the run's stream, published from anywhere, Celery included."""

from __future__ import annotations

import asyncio
import os
import time

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import AnonymousUser, User

from apps.runs.events import event_publish
from apps.runs.models import Run
from apps.control.tasks import run_announce
from rftweb.asgi import application
from tests.conftest import run_socket_connect
from tests.factories import make_experiences
from tests.servers import celery_worker

pytestmark = pytest.mark.django_db(transaction=True)


async def test_an_event_published_inside_a_celery_task_reaches_a_websocket_client(run: Run, owner: User, tmp_path) -> None:
    await sync_to_async(make_experiences)(run, groups=2, group_size=3)
    comm, connected = await run_socket_connect(run, owner)
    assert connected
    with celery_worker("default", name="events", log=tmp_path / "worker.log"):
        await sync_to_async(run_announce.delay)(run.pk)
        message = await comm.receive_json_from(timeout=30)
    assert message == {"type": "buffer.counts", "payload": {"pending": 0, "ready": 6, "leased": 0, "consumed": 0, "filtered": 0}}
    await comm.disconnect()


async def test_members_receive_events_and_outsiders_cannot_subscribe(run: Run, annotator: User, outsider: User) -> None:
    member, ok = await run_socket_connect(run, annotator)
    assert ok
    stranger, stranger_ok = await run_socket_connect(run, outsider)
    assert not stranger_ok
    anonymous, anonymous_ok = await run_socket_connect(run, AnonymousUser())
    assert not anonymous_ok
    await sync_to_async(event_publish)(run_id=run.pk, type="weights.synced", payload={"version": 3})
    assert await member.receive_json_from(timeout=30) == {"type": "weights.synced", "payload": {"version": 3}}
    await member.disconnect()


async def test_events_of_one_run_do_not_reach_another(run: Run, owner: User) -> None:
    from tests.factories import make_run

    other = await sync_to_async(make_run)(owner=owner, name="other")
    comm, _ = await run_socket_connect(other, owner)
    await sync_to_async(event_publish)(run_id=run.pk, type="run.status", payload={"status": "paused"})
    assert await comm.receive_nothing(timeout=0.5)
    await comm.disconnect()


async def test_a_forked_worker_process_publishes_through_a_loop_of_its_own(run: Run, owner: User) -> None:
    # The parent's publisher thread exists before the fork, as in Celery's prefork pool.
    await sync_to_async(event_publish)(run_id=run.pk, type="run.status", payload={"status": "before"})
    comm, _ = await run_socket_connect(run, owner)

    def fork_and_publish() -> int:
        pid = os.fork()
        if pid == 0:
            try:
                event_publish(run_id=run.pk, type="run.status", payload={"status": "from the child"})
            finally:
                os._exit(0)
        return os.waitpid(pid, 0)[1]

    assert await asyncio.to_thread(fork_and_publish) == 0
    assert await comm.receive_json_from(timeout=30) == {"type": "run.status", "payload": {"status": "from the child"}}
    await comm.disconnect()


def test_unknown_event_types_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown event type 'run.exploded'"):
        event_publish(run_id=1, type="run.exploded", payload={})


async def test_the_asgi_router_refuses_an_anonymous_socket(run: Run) -> None:
    comm = WebsocketCommunicator(application, f"/ws/runs/{run.pk}/", headers=[(b"origin", b"http://localhost"), (b"host", b"localhost")])
    connected, _ = await comm.connect(timeout=30)  # a refusal answers at once; a busy host is no refusal
    assert not connected
    await asyncio.sleep(0)



def test_an_idle_consumer_outlives_the_layers_blocking_read() -> None:
    # channels_redis blocks in BZPOPMIN for brpop_timeout seconds; a socket timeout that is
    # not longer makes idle consumers die with "Timeout reading from localhost:6379".
    from channels.layers import get_channel_layer
    from channels_redis.utils import create_pool

    layer = get_channel_layer()
    pool = create_pool(layer.hosts[0])
    assert pool.connection_kwargs["socket_timeout"] > layer.brpop_timeout


async def test_a_burst_of_events_tells_the_runs_lists_twice_and_heartbeats_not_at_all(run: Run, owner: User) -> None:
    from channels.routing import URLRouter

    from apps.runs.events import RUNS_LIST_NOTICE_SECONDS
    from rftweb.routing import websocket_urlpatterns

    comm = WebsocketCommunicator(URLRouter(websocket_urlpatterns), "/ws/runs/")
    comm.scope["user"] = owner
    assert (await comm.connect(timeout=10))[0]
    # Past every notice of the run's creation: its trailing notice comes when an interval ends,
    # which on a loaded host can be after a sleep of exactly one interval.
    await asyncio.sleep(RUNS_LIST_NOTICE_SECONDS)
    while not await comm.receive_nothing(timeout=RUNS_LIST_NOTICE_SECONDS + 0.5):
        await comm.receive_json_from(timeout=1)

    def burst() -> float:
        started = time.monotonic()
        for step in range(50):
            event_publish(run_id=run.pk, type="run.metric", payload={"step": step, "values": {"loss": 1.0}})
        return time.monotonic() - started

    elapsed = await sync_to_async(burst)()
    # 50 events: one notice at once, one for the rest when the interval ends (and one more
    # per further interval the burst itself lasted, on a loaded machine), then silence.
    notice = {"type": "runs.changed", "payload": {"run": run.pk}}
    assert await comm.receive_json_from(timeout=30) == notice
    assert await comm.receive_json_from(timeout=30) == notice
    extra = 0
    while not await comm.receive_nothing(timeout=RUNS_LIST_NOTICE_SECONDS + 0.5):
        assert await comm.receive_json_from(timeout=1) == notice
        extra += 1
    assert extra <= int(elapsed // RUNS_LIST_NOTICE_SECONDS), (extra, elapsed)
    # A heartbeat changes no row of the list.
    await sync_to_async(event_publish)(run_id=run.pk, type="worker.heartbeat", payload={})
    assert await comm.receive_nothing(timeout=RUNS_LIST_NOTICE_SECONDS + 0.5)
    await comm.disconnect()


async def test_a_process_that_exits_right_after_touching_runs_delivers_every_notice_without_an_error() -> None:
    """A script or CLI command that changes runs and exits: the notices under way and those
    waiting out their interval all go out, and nothing is logged about Redis at exit (the
    sends once raced the interpreter's executor shutdown: "cannot schedule new futures")."""
    import subprocess
    import sys

    from channels.layers import get_channel_layer

    from apps.runs.events import RUNS_LIST_STREAM, RUNS_LIST_NOTICE
    from tests.servers import ROOT, child_env

    layer = get_channel_layer()
    channel = await layer.new_channel()
    await layer.group_add(RUNS_LIST_STREAM, channel)
    runs = 40
    code = ("import django; django.setup(); from apps.runs.events import runs_list_touch;"
            f"[runs_list_touch(run_id=900000 + i) for i in range({runs})];"
            "runs_list_touch(run_id=900000)")  # within its interval: waits for the exit flush
    out = await asyncio.to_thread(subprocess.run, [sys.executable, "-c", code], capture_output=True, text=True,
                                  cwd=ROOT, env=child_env(), timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Traceback" not in out.stderr and "could not" not in out.stderr, out.stderr[-3000:]
    got = []
    for _ in range(runs + 1):
        message = await asyncio.wait_for(layer.receive(channel), timeout=10)
        assert message["type"] == RUNS_LIST_NOTICE
        got.append(message["run"])
    assert sorted(set(got)) == [900000 + i for i in range(runs)] and got.count(900000) == 2
    await layer.group_discard(RUNS_LIST_STREAM, channel)


async def test_events_published_together_cross_the_layer_as_few_messages_and_reach_the_page_in_order(
    run: Run, owner: User,
) -> None:
    """An explore step's 128 rollouts were 128 layer messages, each a Redis round trip the
    step waited for (40 ms a step); now one envelope, or several where the texts are long,
    and a browser socket still gets every event, in order."""
    from channels.layers import get_channel_layer

    from apps.runs.events import ENVELOPE_BYTES, event_publish_many, layer_events, run_stream_name

    layer = get_channel_layer()
    channel = await layer.new_channel()
    await layer.group_add(run_stream_name(run.pk), channel)
    page, ok = await run_socket_connect(run, owner)
    assert ok
    short = [("experience.created", {"id": i, "response": f"<answer>{i}</answer>"}) for i in range(128)]
    await sync_to_async(event_publish_many)(run_id=run.pk, events=short)
    message = await asyncio.wait_for(layer.receive(channel), timeout=10)
    # All 128 in the one message (were any left out, the next receive below would get them).
    assert [e["payload"]["id"] for e in layer_events(message)] == list(range(128))

    long = [("experience.created", {"id": i, "response": "x" * (ENVELOPE_BYTES // 3)}) for i in range(7)]
    await sync_to_async(event_publish_many)(run_id=run.pk, events=long)
    envelopes = [await asyncio.wait_for(layer.receive(channel), timeout=10) for _ in range(4)]  # 2 + 2 + 2 + 1
    assert [len(layer_events(m)) for m in envelopes] == [2, 2, 2, 1]
    assert [e["payload"]["id"] for m in envelopes for e in layer_events(m)] == list(range(7))

    seen: list[int] = []
    while len(seen) < 128 + 7:
        frame = await page.receive_json_from(timeout=10)
        events = frame["events"] if frame["type"] == "batch" else [frame]
        seen += [e["payload"]["id"] for e in events if e["type"] == "experience.created"]
    assert seen == list(range(128)) + list(range(7))
    await page.disconnect()
    await layer.group_discard(run_stream_name(run.pk), channel)
