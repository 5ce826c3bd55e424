"""What the ASGI layer decides before Django reads a body (issue 49; rftweb/request_guard.py),
under uvicorn (as docker-compose.yml runs it) and daphne (runserver, the embedded default):
an API body without credentials is refused 401 and a declared length over the cap 413 while
the body is still unsent; a chunked body is refused 413 as soon as it passes the cap; the
client's address comes from X-Forwarded-For only when the peer is a proxy named in
FORWARDED_ALLOW_IPS. Raw sockets, so the test sees exactly how much was sent when the answer came."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.servers import start_server, start_uvicorn, stop

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

CAP = 1024 * 1024  # RFT_MAX_BODY_BYTES and RFT_MAX_REQUEST_BYTES of the servers below
HUGE = 300 * 1024 * 1024


@pytest.fixture(params=["uvicorn", "daphne"])
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "uvicorn":
        proc, url = start_uvicorn(log=tmp_path / "web.log", RFT_MAX_BODY_BYTES=str(CAP), RFT_MAX_REQUEST_BYTES=str(CAP))
    else:
        proc, url = start_server(log=tmp_path / "web.log", RFT_MAX_BODY_BYTES=str(CAP), RFT_MAX_REQUEST_BYTES=str(CAP))
    try:
        yield url
    finally:
        stop(proc)


def _connect(url: str) -> socket.socket:
    parts = urlsplit(url)
    sock = socket.create_connection((parts.hostname, parts.port), timeout=30)
    return sock


def _head(method: str, path: str, headers: dict[str, str]) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", *[f"{k}: {v}" for k, v in headers.items()]]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _answer(sock: socket.socket) -> tuple[int, bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next((int(line.split(b":", 1)[1]) for line in head.lower().split(b"\r\n")
                   if line.startswith(b"content-length:")), 0)
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return int(data.split(b" ", 2)[1]), head + b"\r\n\r\n" + body


def _answered_before_body(url: str, path: str, headers: dict[str, str]) -> tuple[int, bytes]:
    """Sends only the headers of a HUGE body and waits for the answer."""
    with _connect(url) as sock:
        sock.sendall(_head("POST", path, {"Content-Length": str(HUGE), **headers}))
        return _answer(sock)


def test_an_anonymous_api_body_is_refused_401_and_a_declared_length_over_the_cap_413_before_it_is_sent(
        server: str) -> None:
    status, raw = _answered_before_body(server, "/api/v1/runs/1/feedback", {"Content-Type": "application/json"})
    assert status == 401 and b"Authorization: Bearer" in raw and b"www-authenticate: bearer" in raw.lower()
    assert b'"code": "unauthenticated"' in raw  # the API's stable code, as every /api/v1 refusal carries
    status, raw = _answered_before_body(server, "/api/v1/runs/1/openai/v1/chat/completions", {})
    assert status == 401 and b"invalid_api_key" in raw
    status, raw = _answered_before_body(server, "/api/v1/runs/1/feedback", {"Authorization": "Bearer rft_x_y"})
    assert status == 413 and b"larger than 1048576 bytes" in raw and b'"code": "too_large"' in raw
    status, raw = _answered_before_body(server, "/runs/new/", {"Content-Type": "multipart/form-data; boundary=x"})
    assert status == 413 and b"RFT_MAX_REQUEST_BYTES" in raw


def test_a_chunked_body_is_refused_once_it_passes_the_cap_not_after_it_ends(server: str) -> None:
    piece = b"x" * 65536
    sent = 0
    with _connect(server) as sock:
        sock.sendall(_head("POST", "/api/v1/runs/1/trajectories",
                           {"Authorization": "Bearer rft_abc_def", "Transfer-Encoding": "chunked",
                            "Content-Type": "application/json"}))
        sock.settimeout(0.05)
        answer = b""
        deadline = time.monotonic() + 60
        while not answer and sent < 64 * CAP and time.monotonic() < deadline:
            try:
                sock.sendall(b"%x\r\n" % len(piece) + piece + b"\r\n")
                sent += len(piece)
            except OSError:  # the server closed after answering
                pass
            try:
                answer = sock.recv(65536)
            except (TimeoutError, BlockingIOError):
                continue
            except OSError:
                break
        sock.settimeout(30)
        while answer and b"\r\n\r\n" not in answer:
            more = sock.recv(65536)
            if not more:
                break
            answer += more
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    # Answered at the cap, give or take what the sockets' buffers held: not after 64 MiB.
    assert sent < 16 * CAP, sent


def test_forwarded_for_is_believed_only_from_the_proxies_named(settings: Any) -> None:
    import asyncio

    from rftweb.request_guard import RequestGuard

    seen: list[Any] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(scope["client"])

    def client_of(peer: str, forwarded: str | None, allowed: list[str]) -> Any:
        settings.FORWARDED_ALLOW_IPS = allowed
        headers = [(b"x-forwarded-for", forwarded.encode())] if forwarded else []
        scope = {"type": "websocket", "path": "/ws/runs/", "client": (peer, 5000), "headers": headers}
        asyncio.run(RequestGuard(app)(scope, None, None))  # type: ignore[arg-type]
        return seen[-1][0]

    # Nobody named (the default): the peer, whatever it claims.
    assert client_of("198.51.100.9", "10.9.9.9", []) == "198.51.100.9"
    # The proxy named: the client its header names; a chain's own proxies are skipped, and
    # what the client wrote left of them is not believed.
    assert client_of("10.0.0.2", "203.0.113.5", ["10.0.0.2"]) == "203.0.113.5"
    assert client_of("10.0.0.2", "1.2.3.4, 203.0.113.5, 10.0.0.3", ["10.0.0.0/24"]) == "203.0.113.5"
    # A peer that is not the proxy cannot use the header.
    assert client_of("198.51.100.9", "203.0.113.5", ["10.0.0.2"]) == "198.51.100.9"


def test_the_login_throttle_counts_the_peer_not_the_address_a_client_claims(tmp_path: Path) -> None:
    """Through uvicorn as compose runs it (no proxy named): a guesser rotating
    X-Forwarded-For is still one address, and is paused after ten wrong passwords."""
    import httpx

    from tests.factories import make_user

    make_user("victim")
    proc, url = start_uvicorn(log=tmp_path / "web.log", CSRF_COOKIE_SECURE="0", SESSION_COOKIE_SECURE="0")
    try:
        statuses = []
        for i in range(11):
            with httpx.Client(base_url=url, timeout=30) as http:
                form = http.get("/login/")
                token = http.cookies["csrftoken"]
                answer = http.post("/login/", data={"username": "victim", "password": f"guess-{i}",
                                                    "csrfmiddlewaretoken": token},
                                   headers={"X-Forwarded-For": f"203.0.113.{i}", "Referer": f"{url}/login/"})
                assert form.status_code == 200
                statuses.append(answer.status_code)
        assert statuses[:9] == [200] * 9 and statuses[-1] == 429, statuses
    finally:
        stop(proc)
