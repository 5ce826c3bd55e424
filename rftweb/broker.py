"""Kombu's Redis transport, keeping one redis-py client per channel instead of building one
for every command it sends outside the consuming loop.

Kombu wraps each publish, each acknowledgement and each delivery's bookkeeping (the
unacked index a late-acknowledged task sits in) in a fresh `redis.Redis(connection_pool=…)`.
With redis-py 8 that constructor copies its ~170 response callbacks into a case-insensitive
dict: about 0.2 ms of CPU, twice per task on a worker (deliver, ack) and once per task sent.
On a rollout worker serving OpenAI calls one after another that was a sixth of its CPU per
call outside the engine (bench/openai_endpoint). A redis-py client is safe to share between
threads (each command checks a connection out of the pool), so the channel keeps the one it
built, and builds another only when its pool was replaced (after a fork or a reconnect).

Used for `redis://` brokers (rftweb/settings.py: CELERY_BROKER_TRANSPORT); everything else
is kombu's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kombu.transport import redis as kombu_redis

if TYPE_CHECKING:
    from redis import Redis


class RedisChannel(kombu_redis.Channel):  # type: ignore[misc]  # kombu is skipped (pyproject.toml)
    _kept_client: tuple[object, Redis] | None = None  # (the pool it uses, the client)

    def _create_client(self, asynchronous: bool = False) -> Redis:
        if asynchronous:
            # Built once per channel by kombu already (`client`, `subclient`).
            client: Redis = super()._create_client(asynchronous=True)
            return client
        pool = self.pool
        kept = self._kept_client
        if kept is None or kept[0] is not pool:
            kept = self._kept_client = (pool, super()._create_client())
        return kept[1]


class RedisTransport(kombu_redis.Transport):  # type: ignore[misc]  # kombu is skipped (pyproject.toml)
    Channel = RedisChannel
