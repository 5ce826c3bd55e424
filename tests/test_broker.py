"""The Redis broker transport (rftweb/broker.py): messages sent, received and acknowledged as
with kombu's own, without building a redis-py client for each of them."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from kombu import Connection

from rftweb.broker import RedisTransport
from tests.servers import EVENT_WAIT_S


@pytest.fixture
def broker() -> Iterator[Connection]:
    if not settings.REDIS_URL.startswith("redis://"):
        pytest.skip("needs a redis:// REDIS_URL")
    with Connection(settings.REDIS_URL, transport=RedisTransport) as conn:
        yield conn


@pytest.fixture
def clients_built(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Grows by one for every redis-py client constructed."""
    import redis

    built: list[int] = []
    real_init = redis.Redis.__init__

    def counting_init(self: Any, *args: Any, **kwargs: Any) -> None:
        built.append(1)
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(redis.Redis, "__init__", counting_init)
    return built


def _send_and_take(conn: Connection, count: int) -> list[int]:
    """Publish `count` messages onto a fresh queue, then take each one and acknowledge it."""
    queue = conn.SimpleQueue(f"test-broker-{uuid.uuid4().hex}")
    try:
        for i in range(count):
            queue.put({"i": i})
        taken = []
        for _ in range(count):
            message = queue.get(timeout=EVENT_WAIT_S)
            taken.append(message.payload["i"])
            message.ack()
        with pytest.raises(queue.Empty):
            queue.get_nowait()
        return taken
    finally:
        queue.queue.delete()
        queue.close()


def test_the_app_sends_through_this_transport_where_the_broker_is_redis() -> None:
    from rftweb.celery import app

    if not settings.REDIS_URL.startswith("redis://"):
        pytest.skip("needs a redis:// REDIS_URL")
    with app.connection_for_write() as conn:
        assert isinstance(conn.transport, RedisTransport)
        assert conn.transport.driver_type == "redis"  # what Celery's Redis-only features check


def test_fifty_messages_sent_taken_and_acknowledged_build_a_handful_of_clients_not_a_hundred(
    broker: Connection, clients_built: list[int]
) -> None:
    assert _send_and_take(broker, 50) == list(range(50))
    # kombu's own transport built one per publish, one per delivery's unacked entry and one
    # per acknowledgement: 150 here.
    assert len(clients_built) <= 4, len(clients_built)


def test_a_channel_whose_pool_was_dropped_after_a_fork_builds_its_client_on_the_new_pool(broker: Connection) -> None:
    assert _send_and_take(broker, 2) == [0, 1]
    channel = broker.default_channel
    with channel.conn_or_acquire() as before:
        assert before.connection_pool is channel.pool
    channel._after_fork()  # what kombu does in a forked child: the parent's sockets are not ours
    with channel.conn_or_acquire() as after:
        assert after.connection_pool is channel.pool and after is not before
    assert _send_and_take(broker, 3) == [0, 1, 2]
