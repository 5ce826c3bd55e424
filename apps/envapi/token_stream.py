"""Tokens from a rollout worker to the web process serving `stream: true`, as they are sampled.

The web side names a Redis list in the generation request (`stream_key`); the worker pushes
JSON events onto it while the engine generates: `{"t": "start"}` once the request is
accepted (a refusal before that comes back as the task's answer, an OpenAI 4xx), then
`{"t": "tok", "p": [piece of choice 0, piece of choice 1, …]}` per decoding step, then
`{"t": "end"}`. The task's answer (exact token ids, logprobs, parsed tool calls) still comes
back through Celery and is the authority: the stream only sends text early. A list rather
than pub/sub, so events pushed before the reader blocks are not lost; it expires on its own.

Without Redis (the embedded default) there is no key and the answer streams once it is whole.

The answer itself comes back the same way (`reply_key_new`, `reply_push`, `reply_wait`): the
worker pushes it onto a list the web process waits on in its event loop, and the task is sent
with `ignore_result`. Through Celery's result backend each call cost the worker a GET before
its SET + PUBLISH (Celery checks it is not overwriting a success) and the web process a thread
parked in `AsyncResult.get` with a SUBSCRIBE and an UNSUBSCRIBE; the worker serves the
calls one after another, so what it spends per call is what every queued caller waits
(bench/openai_endpoint).
"""

from __future__ import annotations

import asyncio
import json
import uuid
import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING

from django.conf import settings

if TYPE_CHECKING:
    import redis
    import redis.asyncio as aioredis

PREFIX = "rftweb:openai:stream:"
REPLY_PREFIX = "rftweb:openai:reply:"
# A stream nobody reads (the client went away) is gone after this long.
TTL_SECONDS = 600
_SLICE_SECONDS = 2.0
# How long a client waits on Redis's answer before it gives the connection up. redis-py's
# default (5 s) is close enough to a blocking pop's own wait that a loaded host (CI: an engine
# starting on both cores) crossed it and failed a call; worse, a pop that Redis answered but
# the client abandoned loses what it popped. Well above a slice, as the channel layer's 30 s.
SOCKET_TIMEOUT = 30.0


def stream_key_new() -> str | None:
    """A fresh list name, or None where there is no Redis to carry tokens."""
    return f"{PREFIX}{uuid.uuid4().hex}" if settings.REDIS_URL else None


def reply_key_new() -> str | None:
    """A fresh list name for a task's answer, or None where there is no Redis."""
    return f"{REPLY_PREFIX}{uuid.uuid4().hex}" if settings.REDIS_URL else None


_sync_clients: dict[str, redis.Redis] = {}


def _sync_client() -> redis.Redis:
    """The worker process's Redis client (one connection pool per URL, kept)."""
    import redis

    url = settings.REDIS_URL
    client = _sync_clients.get(url)
    if client is None:
        client = _sync_clients[url] = redis.Redis.from_url(url, socket_timeout=SOCKET_TIMEOUT)
    return client


# One asyncio client (a connection pool) per event loop: its connections belong to the loop
# that opened them. A client per request, as the reader had, opened a new connection for
# every streamed call and closed it after.
_async_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, tuple[str, aioredis.Redis]] = weakref.WeakKeyDictionary()


def _async_client() -> aioredis.Redis:
    import redis.asyncio as aioredis

    loop = asyncio.get_running_loop()
    url = settings.REDIS_URL
    kept = _async_clients.get(loop)
    if kept is None or kept[0] != url:
        kept = _async_clients[loop] = (url, aioredis.Redis.from_url(url, socket_timeout=SOCKET_TIMEOUT))
    return kept[1]


def _push(key: str, event: Mapping[str, object]) -> None:
    pipe = _sync_client().pipeline(transaction=False)
    pipe.rpush(key, json.dumps(event, separators=(",", ":"), ensure_ascii=False))
    pipe.expire(key, TTL_SECONDS)
    pipe.execute()


def reply_push(key: str, answer: Mapping[str, object]) -> None:
    """The worker's end of a reply: the task's answer, in one round trip."""
    if not key.startswith(REPLY_PREFIX):
        raise ValueError("not a reply key")
    _push(key, answer)


async def reply_wait(key: str, *, timeout: float) -> dict[str, object] | None:
    """The web process's end: the answer pushed onto `key`, or None after `timeout` seconds."""
    # Cancelled (the caller went away), an answer pushed later expires on its own.
    client = _async_client()
    deadline = asyncio.get_running_loop().time() + timeout
    while (left := deadline - asyncio.get_running_loop().time()) > 0:
        # In slices, each well under the client's socket timeout (a blocking command's read
        # counts against it too). A list keeps what is pushed meanwhile.
        popped = await client.blpop([key], timeout=min(left, _SLICE_SECONDS))
        if popped:
            return dict(json.loads(popped[1]))
    return None


class StreamWriter:
    """The worker's end: `push` an event (a few hundred bytes, one round trip)."""

    def __init__(self, key: str) -> None:
        if not key.startswith(PREFIX):
            raise ValueError("not a token stream key")
        self.key = key

    def push(self, event: Mapping[str, object]) -> None:
        _push(self.key, event)


class StreamReader:
    """The web process's end (asyncio): `next` waits up to `timeout` seconds for an event."""

    def __init__(self, key: str) -> None:
        self.client = _async_client()
        self.key = key

    async def next(self, timeout: float) -> dict[str, object] | None:
        if timeout <= 0:
            raw = await self.client.lpop(self.key)
        else:
            popped = await self.client.blpop([self.key], timeout=timeout)
            raw = popped[1] if popped else None
        if raw is None:
            return None
        return dict(json.loads(raw if isinstance(raw, (str, bytes)) else raw[0]))

    async def close(self) -> None:
        # The client is the loop's, shared: only the list goes.
        await self.client.delete(self.key)
