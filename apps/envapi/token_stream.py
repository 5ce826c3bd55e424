"""Tokens from a rollout worker to the web process serving `stream: true`, as they are sampled.

The web side names a Redis list in the generation request (`stream_key`); the worker pushes
JSON events onto it while the engine generates: `{"t": "start"}` once the request is
accepted (a refusal before that comes back as the task's answer, an OpenAI 4xx), then
`{"t": "tok", "p": [piece of choice 0, piece of choice 1, …]}` per decoding step, then
`{"t": "end"}`. The task's answer (exact token ids, logprobs, parsed tool calls) still comes
back through Celery and is the authority: the stream only sends text early. A list rather
than pub/sub, so events pushed before the reader blocks are not lost; it expires on its own.

Without Redis (the embedded default) there is no key and the answer streams once it is whole.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from django.conf import settings

PREFIX = "rftweb:openai:stream:"
# A stream nobody reads (the client went away) is gone after this long.
TTL_SECONDS = 600


def stream_key_new() -> str | None:
    """A fresh list name, or None where there is no Redis to carry tokens."""
    return f"{PREFIX}{uuid.uuid4().hex}" if settings.REDIS_URL else None


class StreamWriter:
    """The worker's end: `push` an event (a few hundred bytes, one round trip)."""

    _clients: dict[str, Any] = {}

    def __init__(self, key: str) -> None:
        import redis

        if not key.startswith(PREFIX):
            raise ValueError("not a token stream key")
        url = settings.REDIS_URL
        client = self._clients.get(url)
        if client is None:
            client = self._clients[url] = redis.Redis.from_url(url)
        self.client = client
        self.key = key

    def push(self, event: dict[str, Any]) -> None:
        pipe = self.client.pipeline(transaction=False)
        pipe.rpush(self.key, json.dumps(event, separators=(",", ":"), ensure_ascii=False))
        pipe.expire(self.key, TTL_SECONDS)
        pipe.execute()


class StreamReader:
    """The web process's end (asyncio): `next` waits up to `timeout` seconds for an event."""

    def __init__(self, key: str) -> None:
        import redis.asyncio as aioredis

        self.client = aioredis.Redis.from_url(settings.REDIS_URL)
        self.key = key

    async def next(self, timeout: float) -> dict[str, Any] | None:
        if timeout <= 0:
            raw = await self.client.lpop(self.key)
        else:
            popped = await self.client.blpop([self.key], timeout=timeout)
            raw = popped[1] if popped else None
        if raw is None:
            return None
        return dict(json.loads(raw if isinstance(raw, (str, bytes)) else raw[0]))

    async def close(self) -> None:
        try:
            await self.client.delete(self.key)
        finally:
            await self.client.aclose()
