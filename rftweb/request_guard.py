"""The ASGI layer's guard, around the whole application (rftweb/asgi.py), for daphne and
uvicorn alike: what is decided before Django reads a byte of the body.

- The client's address: the connecting peer's, or, when that peer is a proxy named in
  FORWARDED_ALLOW_IPS (addresses or networks; empty by default, `*` trusts any), the last
  address in X-Forwarded-For that is not itself such a proxy. Everything downstream (the
  login throttle's per-address count, logs) reads `scope["client"]`, so a client cannot
  choose its own address with a header.
- Body caps across all parts of a request: RFT_MAX_BODY_BYTES under /api/ (the API's JSON
  bodies), RFT_MAX_REQUEST_BYTES elsewhere (a form with its uploaded files). A declared
  Content-Length over the cap is answered 413 before any of the body is read; a body without
  one (chunked) is counted as it is read, and answered 413 as soon as it passes the cap
  (Django then sees the client gone and answers nothing more).
- An API request that sends a body without any credentials (no `Authorization: Bearer`) is
  answered 401 before its body is read: only a key's holder can make the server read.
"""

from __future__ import annotations

import ipaddress
import json
import logging
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any
from urllib.parse import unquote

from django.conf import settings

from rftweb.exceptions import status_code

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
OPENAI_MARK = "/openai/"


def trusted_proxies(names: Iterable[str]) -> tuple[bool, list[IPNetwork]]:
    """(any peer trusted, the trusted networks) of FORWARDED_ALLOW_IPS's entries."""
    networks: list[IPNetwork] = []
    for name in names:
        name = name.strip()
        if name == "*":
            return True, []
        if name:
            networks.append(ipaddress.ip_network(name, strict=False))
    return False, networks


class RequestGuard:
    """ASGI middleware: the client's address, body caps, and bodies refused to the anonymous."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.trust_any, self.proxies = trusted_proxies(settings.FORWARDED_ALLOW_IPS)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            scope = self._with_client(scope)
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path: str = scope.get("path", "")
        refusal = refusal_before_body(path, _headers(scope))
        if refusal is not None:
            return await _refuse(send, *refusal)
        await _Capped(self.app, scope, receive, send, body_cap(path), path).run()

    def _trusted(self, host: str) -> bool:
        if self.trust_any:
            return True
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return False
        return any(address in network for network in self.proxies)

    def _with_client(self, scope: Scope) -> Scope:
        client = scope.get("client")
        if not client or not (self.trust_any or self.proxies) or not self._trusted(str(client[0])):
            return scope
        forwarded = _headers(scope).get("x-forwarded-for", "")
        hops = [hop.strip() for hop in forwarded.split(",") if hop.strip()]
        # From the right: each hop was added by the proxy after it; the first one not a proxy
        # of ours is the client as our own proxies saw it (anything left of it, the client wrote).
        for hop in reversed(hops):
            if not self._trusted(hop):
                return {**scope, "client": (hop, 0)}
        return {**scope, "client": (hops[0], 0)} if hops else scope


class _Capped:
    """One request's run with its body counted as it is read."""

    def __init__(self, app: ASGIApp, scope: Scope, receive: Receive, send: Send, cap: int, path: str) -> None:
        self.app, self.scope, self._receive, self._send = app, scope, receive, send
        self.cap, self.path = cap, path
        self.read = 0
        self.refused = False

    async def run(self) -> None:
        await self.app(self.scope, self.receive, self.send)

    async def receive(self) -> Message:
        if self.refused:
            return {"type": "http.disconnect"}
        message = await self._receive()
        if message.get("type") == "http.request":
            self.read += len(message.get("body", b""))
            if self.read > self.cap:
                # Answered now, not after the rest arrives; to the app the client is gone.
                self.refused = True
                log.warning("%s: body passed %s bytes while being read: answered 413", self.path, self.cap)
                await _refuse(self._send, 413, _too_large(self.path, self.cap))
                return {"type": "http.disconnect"}
        return message

    async def send(self, message: Message) -> None:
        if not self.refused:  # after our 413, whatever the app still sends has no one to go to
            await self._send(message)


Refusal = tuple[int, "dict[str, object] | str", dict[str, str]]


def body_cap(path: str) -> int:
    return int(settings.RFT_MAX_BODY_BYTES if path.startswith("/api/") else settings.RFT_MAX_REQUEST_BYTES)


def refusal_before_body(path: str, headers: dict[str, str]) -> Refusal | None:
    """What to answer before reading the body, from the path and headers alone: 401 for an
    API body sent without credentials, 413 for a declared length over the path's cap."""
    declared = _content_length(headers)
    sends_body = (declared or 0) > 0 or "transfer-encoding" in headers
    if path.startswith("/api/") and sends_body and not headers.get("authorization", "").lower().startswith("bearer "):
        return 401, _unauthorised(path), {"WWW-Authenticate": "Bearer"}
    if declared is not None and declared > body_cap(path):
        return 413, _too_large(path, body_cap(path)), {}
    return None


def _headers(scope: Scope) -> dict[str, str]:
    return {bytes(k).decode("latin-1").lower(): bytes(v).decode("latin-1") for k, v in scope.get("headers", ())}


def _content_length(headers: dict[str, str]) -> int | None:
    try:
        return int(headers["content-length"])
    except (KeyError, ValueError):
        return None


def _unauthorised(path: str) -> dict[str, object]:
    message = "missing, unknown or revoked API key; send 'Authorization: Bearer rft_…'"
    if OPENAI_MARK in path:  # the OpenAI-compatible door answers in its clients' shape
        return {"error": {"message": message, "type": "invalid_request_error", "code": "invalid_api_key"}}
    return {"detail": message, "errors": {}, "code": status_code(401), "error_class": status_code(401)}


def _too_large(path: str, cap: int) -> dict[str, object] | str:
    message = f"the request body is larger than {cap} bytes"
    if OPENAI_MARK in path:
        return {"error": {"message": message, "type": "invalid_request_error", "code": "request_too_large"}}
    if path.startswith("/api/"):
        return {"detail": message, "errors": {"body": message}, "field": "body", "code": status_code(413),
                "error_class": status_code(413)}
    return f"Request too large: {message} (RFT_MAX_REQUEST_BYTES, all files and fields together).\n"


def _response(body: dict[str, object] | str, headers: dict[str, str] | None) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    if isinstance(body, str):
        payload, kind = body.encode(), b"text/plain; charset=utf-8"
    else:
        payload, kind = json.dumps(body).encode(), b"application/json"
    raw = [(b"content-type", kind), (b"content-length", str(len(payload)).encode()),
           (b"connection", b"close"), (b"cache-control", b"no-store")]
    raw += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    return payload, raw


async def _refuse(send: Send, status: int, body: dict[str, object] | str, headers: dict[str, str] | None = None) -> None:
    payload, raw = _response(body, headers)
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": payload})


# ---- daphne ---------------------------------------------------------------------------
# Daphne (Twisted) receives a request's whole body, into memory or a temporary file, before
# it calls the application at all, and then queues all of it for the app at once: the guard
# above would decide only after the reading it is there to prevent. So under daphne the same
# decisions are made where Twisted learns the length (gotLength, once the headers are in)
# and as each piece of the body arrives (handleContentChunk); a refusal is written to the
# connection, which is then closed, and the request never reaches the application.

_REASONS = {401: b"Unauthorized", 413: b"Content Too Large"}


def _twisted_refuse(request: Any, refusal: Refusal) -> None:
    status, body, headers = refusal
    request._rft_refused = True
    payload, raw = _response(body, headers)
    head = b"HTTP/1.1 %d %s\r\n" % (status, _REASONS.get(status, b"Refused"))
    head += b"".join(k + b": " + v + b"\r\n" for k, v in raw) + b"\r\n"
    transport = request.channel.transport
    transport.write(head + payload)
    transport.loseConnection()


def _twisted_path(request: Any) -> str:
    # Twisted parses the request line into its channel before the headers; the request
    # object only gets it when the whole body is in.
    raw = getattr(request.channel, "_path", b"") or b""
    return unquote(raw.split(b"?", 1)[0].decode("latin-1"))


def daphne_guard_install() -> None:
    """Make daphne's request class refuse before and while reading, as RequestGuard does
    (idempotent; a no-op where daphne is not installed)."""
    try:
        from daphne.http_protocol import WebRequest
    except ImportError:
        return
    if getattr(WebRequest, "_rft_guarded", False):
        return
    got_length, content_chunk, process = WebRequest.gotLength, WebRequest.handleContentChunk, WebRequest.process

    def guarded_got_length(self: Any, length: int | None) -> None:
        got_length(self, length)
        self._rft_read = 0
        self._rft_refused = False
        path = self._rft_path = _twisted_path(self)
        headers = {k.decode("latin-1").lower(): b",".join(v).decode("latin-1")
                   for k, v in self.requestHeaders.getAllRawHeaders()}
        refusal = refusal_before_body(path, headers)
        if refusal is not None:
            _twisted_refuse(self, refusal)

    def guarded_content_chunk(self: Any, data: bytes) -> None:
        if getattr(self, "_rft_refused", False):
            return
        self._rft_read = getattr(self, "_rft_read", 0) + len(data)
        path = getattr(self, "_rft_path", "")
        if self._rft_read > body_cap(path):
            log.warning("%s: body passed %s bytes while being read: answered 413", path, body_cap(path))
            _twisted_refuse(self, (413, _too_large(path, body_cap(path)), {}))
            return
        content_chunk(self, data)

    def guarded_process(self: Any) -> Any:
        if getattr(self, "_rft_refused", False):
            return None
        return process(self)

    WebRequest.gotLength = guarded_got_length
    WebRequest.handleContentChunk = guarded_content_chunk
    WebRequest.process = guarded_process
    WebRequest._rft_guarded = True
