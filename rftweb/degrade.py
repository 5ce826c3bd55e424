"""Degrade, don't fail: with Postgres or Redis unreachable a request is answered 503 with
Retry-After and a short page naming the service (JSON under /api/), never a traceback or a
500 (issue #33). Three doors lead here:

- `DegradeMiddleware.process_exception`: a view (or the template it renders) raised;
- `server_error` (the project's handler500): a middleware raised outside any view (a
  session saved in process_response);
- the environment API's own handlers (rftweb/api.py), which answer before Django does.

A websocket handshake that finds Postgres unreachable (Channels' session lookup) is closed
with 1013, try again later (`SocketDegrade`, around Channels' auth in rftweb/asgi.py).

A process that has seen Postgres unreachable remembers it (`POSTGRES_OUTAGE`): until a short
direct connection succeeds again (one request tries every PROBE_SECONDS), requests answer 503
at once, rather than each waiting RFT_DB_POOL_TIMEOUT for a pool that cannot connect. Only the
requests already waiting when the outage began wait that long.

`cached` is the one way pages read Django's cache: with Redis down the value is computed
(the cache is an optimisation, not a dependency). The API key rate limiter fails closed
instead (apps/envapi/services.py `rate_limit_hit`): no count, no request.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import redis.exceptions
from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse, HttpResponseBase, JsonResponse
from django.utils.deprecation import MiddlewareMixin
from django.utils.html import escape

from rftweb.exceptions import status_code
from rftweb.request_guard import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger(__name__)

T = TypeVar("T")

# Seconds a client is told to wait before trying again.
RETRY_AFTER_SECONDS = 10

# Django wraps the driver's errors (psycopg's OperationalError, the pool's PoolTimeout) in
# its own; a Redis server that is gone answers ConnectionError (or TimeoutError).
POSTGRES_ERRORS: tuple[type[Exception], ...] = (OperationalError, InterfaceError)
REDIS_ERRORS: tuple[type[Exception], ...] = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)


# Not a service that is down: this process's database pool had no free connection within
# RFT_DB_POOL_TIMEOUT because every one of its connections was in use (more requests at once
# than the pool serves). Postgres itself answers; the request may simply be sent again.
BUSY = "busy"


def _pool_full() -> bool:
    """Whether this process's database pool holds as many connections as it may (every one
    open, none free): a wait for one that ran out is the pool being busy. Fewer than that
    means the pool tried to open another and could not (Postgres down or refusing)."""
    from django.db import connection

    pool = getattr(connection, "pool", None)
    if pool is None:
        return False
    stats = pool.get_stats()
    return bool(stats.get("pool_size", 0) >= stats.get("pool_max", 1) and not stats.get("pool_available", 0))


def _causes(exc: BaseException | None) -> list[BaseException]:
    """`exc` and what caused it, outermost first (at most 8)."""
    chain: list[BaseException] = []
    while exc is not None and len(chain) < 8:
        chain.append(exc)
        exc = exc.__cause__ or exc.__context__
    return chain


def dependency_down(exc: BaseException | None) -> str | None:
    """'Postgres' or 'Redis' when `exc` (or what caused it) says that service is unreachable;
    BUSY when it is the database pool's wait for a free connection that ran out while every
    connection of the pool was in use (Django wraps the pool's PoolTimeout, itself a psycopg
    OperationalError, in its own OperationalError)."""
    chain = _causes(exc)
    if any(_is_pool_timeout(e) for e in chain):
        return BUSY if _pool_full() else "Postgres"
    for e in chain:
        if isinstance(e, POSTGRES_ERRORS):
            return "Postgres"
        if isinstance(e, REDIS_ERRORS):
            return "Redis"
        import psycopg

        if isinstance(e, (psycopg.OperationalError, psycopg.InterfaceError)):
            return "Postgres"
    return None


def dependency_failed(exc: BaseException | None) -> str | None:
    """`dependency_down`, remembering an unreachable Postgres in POSTGRES_OUTAGE: what each
    door calls on an error it is about to answer 503 for."""
    dependency = dependency_down(exc)
    if dependency == "Postgres":
        POSTGRES_OUTAGE.seen()
    return dependency


# While an outage is remembered, one request every this many seconds tries a direct
# connection: service is back within about this long of Postgres.
PROBE_SECONDS = 0.5
PROBE_CONNECT_TIMEOUT = 2


def _postgres_answers() -> bool:
    """Whether a fresh connection (not the pool's) to the default database opens within
    PROBE_CONNECT_TIMEOUT seconds."""
    from django.db import connection

    try:
        import psycopg

        params = {**connection.get_connection_params(), "connect_timeout": PROBE_CONNECT_TIMEOUT}
        with psycopg.connect(**params):
            return True
    except Exception:  # any failure to connect is the outage going on
        return False


class Outage:
    """This process's memory that a service was unreachable. `seen()` starts it; `holds()`
    says whether a request should answer 503 without trying: True until a probe (one request
    every `probe_seconds`, `probe()` run outside the lock) succeeds."""

    def __init__(self, probe: Callable[[], bool], *, probe_seconds: float = PROBE_SECONDS) -> None:
        self._probe, self._probe_seconds = probe, probe_seconds
        self._lock = threading.Lock()
        self._since: float | None = None
        self._next_probe = 0.0

    def seen(self) -> None:
        with self._lock:
            now = time.monotonic()
            if self._since is None:
                self._since = now
            self._next_probe = max(self._next_probe, now + self._probe_seconds)

    def holds(self) -> bool:
        if self._since is None:  # the common case, without the lock
            return False
        with self._lock:
            if self._since is None:
                return False
            now = time.monotonic()
            if now < self._next_probe:
                return True
            self._next_probe = now + self._probe_seconds  # this request probes; the others wait for it
        if not self._probe():
            return True
        with self._lock:
            log.warning("a direct connection succeeded after %.0f s: requests go to the database again",
                        time.monotonic() - (self._since or time.monotonic()))
            self._since = None
        return False


POSTGRES_OUTAGE = Outage(_postgres_answers)


def pool_connect_failed(error: BaseException) -> None:
    """A new connection of the web pool could not be opened: Postgres is unreachable now.
    The outage is remembered (later requests answer 503 at once), and the requests already
    waiting for that connection are told so now, not after RFT_DB_POOL_TIMEOUT (the pool
    would retry in the background, with a growing delay, while they wait). A full pool's
    wait ("busy") is another thing, and is left to run."""
    from django.db import connections

    POSTGRES_OUTAGE.seen()
    pool = getattr(connections["default"], "pool", None)
    # psycopg_pool keeps its waiting clients in `_waiting`; each takes `fail(error)`.
    waiting = getattr(pool, "_waiting", None)
    lock = getattr(pool, "_lock", None)
    if waiting is None or lock is None:
        return
    with lock:
        while waiting:
            waiting.popleft().fail(error)


def outage_aware_connection_class() -> type:
    """The web pool's connection class (OPTIONS["pool"]["connection_class"]): psycopg's
    Connection, whose failure to connect is told to pool_connect_failed first."""
    import psycopg

    class OutageAwareConnection(psycopg.Connection):
        @classmethod
        def connect(cls, *args: object, **kwargs: object) -> OutageAwareConnection:
            try:
                return super().connect(*args, **kwargs)  # type: ignore[arg-type]
            except psycopg.OperationalError as exc:
                pool_connect_failed(exc)
                raise

    return OutageAwareConnection


def _is_pool_timeout(exc: BaseException | None) -> bool:
    from psycopg_pool import PoolTimeout

    return isinstance(exc, PoolTimeout)


def unavailable_message(dependency: str) -> str:
    if dependency == BUSY:
        return (f"The server is busy: every database connection was in use for "
                f"{_pool_timeout():g} s; try again in {RETRY_AFTER_SECONDS} s")
    return f"{dependency} is unreachable right now; try again in {RETRY_AFTER_SECONDS} s"


def _pool_timeout() -> float:
    from django.conf import settings

    return float(settings.RFT_DB_POOL_TIMEOUT)


def unavailable_response(request: HttpRequest, dependency: str) -> HttpResponse:
    """503 with Retry-After: JSON under /api/ (the API's error shape), else a short page."""
    message = unavailable_message(dependency)
    response: HttpResponse
    if request.path.startswith("/api/"):
        code = status_code(503)  # no error class behind it: its code is its error class's
        response = JsonResponse({"detail": message, "errors": {}, "code": code, "error_class": code}, status=503)
    else:
        page = (
            "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>Unavailable · rftweb</title></head>"
            f"<body><h1>Service unavailable</h1><p>{escape(message)}.</p>"
            "<p>Nothing you sent was lost or saved; reload the page in a moment.</p></body></html>"
        )
        response = HttpResponse(page, status=503, content_type="text/html; charset=utf-8")
    response["Retry-After"] = str(RETRY_AFTER_SECONDS)
    response["Cache-Control"] = "no-store"
    return response


# /ready/ reports the outage itself, naming each dependency (readiness_checks); /health/ is
# liveness (no database); the login form and static files need no database (a request of
# them that does, with a session cookie, fails fast and answers 503 all the same).
OUTAGE_EXEMPT = ("/ready/", "/health/", "/login/")


def _outage_exempt(request: HttpRequest) -> bool:
    from django.conf import settings

    static = "/" + settings.STATIC_URL.lstrip("/")
    return (request.path in OUTAGE_EXEMPT and request.method in ("GET", "HEAD")) or request.path.startswith(static) \
        or request.path == "/ready/"


class DegradeMiddleware(MiddlewareMixin):
    """Turns an unreachable Postgres or Redis under any view into 503 + Retry-After, and
    answers at once while this process remembers Postgres unreachable."""

    def process_request(self, request: HttpRequest) -> HttpResponse | None:
        if _outage_exempt(request) or not POSTGRES_OUTAGE.holds():
            return None
        return unavailable_response(request, "Postgres")

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        dependency = dependency_failed(exception)
        if dependency is None:
            return None
        if dependency == BUSY:
            log.warning("%s %s: no free database connection within %g s (the pool is busy): answered 503",
                        request.method, request.path, _pool_timeout())
        else:
            log.warning("%s %s: %s unreachable (%s): answered 503", request.method, request.path, dependency, exception)
        return unavailable_response(request, dependency)


def server_error(request: HttpRequest) -> HttpResponseBase:
    """handler500: 503 when the exception being handled is an unreachable service (one a
    middleware raised, outside process_exception's reach); Django's 500 page otherwise."""
    from django.views.defaults import server_error as django_server_error

    dependency = dependency_failed(sys.exc_info()[1])
    if dependency is not None:
        return unavailable_response(request, dependency)
    return django_server_error(request)


def cached(key: str, compute: Callable[[], T], timeout: float) -> T:
    """The cached value of `key`, else `compute()` (stored for `timeout` seconds); with the
    cache's Redis unreachable, `compute()` every time."""
    from django.core.cache import cache

    try:
        found: T | None = cache.get(key)
    except REDIS_ERRORS as exc:
        log.warning("cache read of %s failed (%s): computed instead", key, exc)
        return compute()
    if found is not None:
        return found
    value = compute()
    try:
        cache.set(key, value, timeout)
    except REDIS_ERRORS as exc:
        log.warning("cache write of %s failed (%s)", key, exc)
    return value


def readiness_checks() -> dict[str, str]:
    """Each dependency of a request: "ok", "unused" (Redis in the embedded default), or
    "down: <why>"."""
    from django.conf import settings
    from django.db import connection

    checks: dict[str, str] = {}
    if POSTGRES_OUTAGE.holds():
        checks["database"] = "down: unreachable (no direct connection in the last probe)"
    else:
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT 1")
            checks["database"] = "ok"
        except Exception as exc:  # any failure is a database that cannot serve
            dependency_failed(exc)
            checks["database"] = f"down: {type(exc).__name__}: {exc}"[:300]
    if not settings.REDIS_URL:
        checks["redis"] = "unused"
    else:
        client = redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=2, socket_timeout=2)
        try:
            client.ping()
            checks["redis"] = "ok"
        except redis.exceptions.RedisError as exc:
            checks["redis"] = f"down: {type(exc).__name__}: {exc}"[:300]
        finally:
            client.close()
    return checks


# A websocket refused because a service it needs is unreachable: "try again later" (RFC 6455's
# 1013), which the pages reconnect on (apps/runs/consumers.py closes with it for Redis).
TRY_AGAIN_CLOSE_CODE = 1013


class SocketDegrade:
    """ASGI middleware for websockets, outside Channels' session and auth middleware: a
    handshake that finds Postgres unreachable (the session and user lookup, the consumer's
    own checks) is accepted and closed at once with 1013, instead of the server's HTTP 500
    for an application that raised before answering. While this process remembers Postgres
    down (POSTGRES_OUTAGE) the handshake is refused without trying. Once the socket has been
    answered, what it raises is the server's to report, as before."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "websocket":
            await self.app(scope, receive, send)
            return
        if POSTGRES_OUTAGE.holds():
            await self._refuse(scope, send, "Postgres", "a known outage")
            return
        answered = False

        async def send_tracked(message: Message) -> None:
            nonlocal answered
            answered = True
            await send(message)

        try:
            await self.app(scope, receive, send_tracked)
        except Exception as exc:
            dependency = None if answered else dependency_failed(exc)
            if dependency is None:
                raise
            await self._refuse(scope, send, dependency, f"{type(exc).__name__}: {exc}".strip())

    @staticmethod
    async def _refuse(scope: Scope, send: Send, dependency: str, why: str) -> None:
        log.warning("websocket %s refused for now: %s unreachable (%s)", scope.get("path"), dependency,
                    why.splitlines()[0] if why else "")
        await send({"type": "websocket.accept"})
        await send({"type": "websocket.close", "code": TRY_AGAIN_CLOSE_CODE})
