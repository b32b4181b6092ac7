"""What one HTTP client may make `senddock serve` hold: bytes, time and connections.

Everything `serve` answers is small (a one-click form is 26 bytes, an SNS notification a few KiB),
so a client that sends much, or sends slowly, is refused before it costs anything:

* :class:`BodyLimit`, a pure ASGI middleware around every route: a declared ``Content-Length``
  above ``serve.max_body`` is answered 413 before a byte of the body is read; a chunked body is
  counted as it streams and refused the moment it passes the cap; a body that takes longer than
  ``serve.body_timeout`` to arrive is answered 408. Both close the connection, so the rest of the
  body is never read.
* :func:`limited_protocol`: uvicorn's h11 protocol with a deadline for the request line and
  headers (``serve.header_timeout``). uvicorn has none: a client sending one header byte a second
  (slowloris) would hold its connection, and a slot of ``max_connections``, forever.
* The same protocol counts connections per client address: past ``serve.max_connections_per_client``
  a client's next one is answered 503 and closed before uvicorn counts it, so one client never
  holds every one of ``max_connections`` (300 silent connections from one address made every
  other request a 503, /healthz included). A trusted proxy carries many clients and is not counted.
* :meth:`HttpLimits.uvicorn_options`: ``limit_concurrency``, the keep-alive timeout, h11's buffer
  for an unfinished head (16 KiB), and whose X-Forwarded-* headers uvicorn believes:
  ``serve.trusted_proxies``' alone (uvicorn's own default believes 127.0.0.1, and behind a
  same-host proxy that does not send them every client was 127.0.0.1).
"""

from __future__ import annotations

import asyncio
import ipaddress
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import h11
import structlog
from uvicorn.protocols.http.h11_impl import H11Protocol

from senddock.sizes import format_size

if TYPE_CHECKING:
    from senddock.config import ServeSettings

log = structlog.get_logger(__name__)

# How much of an unfinished request head h11 buffers (a longer one is a 400): h11's own default,
# stated here so it is not an accident. A head arriving whole in one read is parsed as it is, so
# what one head can take is bounded by that read (asyncio's 256 KiB), not by this.
MAX_HEAD = 16 * 1024


@dataclass(frozen=True)
class HttpLimits:
    max_body: int
    body_timeout: float
    header_timeout: float
    max_connections: int
    keep_alive_timeout: float
    max_connections_per_client: int = 20
    trusted_proxies: tuple[str, ...] = ()

    @classmethod
    def from_settings(cls, serve: ServeSettings) -> HttpLimits:
        """From the ``serve`` section."""
        return cls(
            max_body=serve.max_body,
            body_timeout=serve.body_timeout,
            header_timeout=serve.header_timeout,
            max_connections=serve.max_connections,
            keep_alive_timeout=serve.keep_alive_timeout,
            max_connections_per_client=serve.max_connections_per_client,
            trusted_proxies=serve.trusted_proxies,
        )

    def uvicorn_options(self) -> dict[str, Any]:
        return {
            "http": limited_protocol(self.header_timeout, self.max_connections_per_client,
                                     trusted(self.trusted_proxies)),
            # uvicorn counts the connection asking too: with limit N it serves N - 1 at once.
            "limit_concurrency": self.max_connections + 1,
            "timeout_keep_alive": self.keep_alive_timeout,
            "h11_max_incomplete_event_size": MAX_HEAD,
            # Forwarded headers believed from the configured proxies only, none by default.
            "proxy_headers": bool(self.trusted_proxies),
            "forwarded_allow_ips": list(self.trusted_proxies) or None,
        }


def trusted(networks: tuple[str, ...]) -> Callable[[str | None], bool]:
    """Whether an address is one of ``networks`` (``serve.trusted_proxies``: validated)."""
    parsed = [ipaddress.ip_network(n, strict=False) for n in networks]

    def contains(address: str | None) -> bool:
        if not parsed or not address:
            return False
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False
        return any(ip in network for network in parsed)

    return contains


class _Refused(Exception):
    """Raised out of ``receive`` to unwind the app; :class:`BodyLimit` answers in its place."""


class BodyLimit:
    """Refuse request bodies over ``max_body`` bytes (413) or slower than ``timeout`` seconds (408)."""

    def __init__(self, app: Any, *, max_body: int, timeout: float) -> None:
        self.app = app
        self.max_body = max_body
        self.timeout = timeout

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared, chunked = _framing(scope)
        if declared is not None and declared > self.max_body:
            await self._refuse(scope, send, 413)
            return
        state = _BodyState(expects_body=chunked or bool(declared))
        deadline = asyncio.get_running_loop().time() + self.timeout

        async def limited_receive() -> dict[str, Any]:
            if state.complete:
                return await receive()  # after the body: only http.disconnect remains
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                state.refused = 408
                raise _Refused from None
            if message["type"] == "http.request":
                state.received += len(message.get("body", b""))
                if state.received > self.max_body:
                    state.refused = 413
                    raise _Refused
                state.complete = not message.get("more_body", False)
            return message

        async def guarded_send(message: dict[str, Any]) -> None:
            if state.refused and not state.started:
                return  # the app caught _Refused and answered anyway: the refusal is what is sent
            if message["type"] == "http.response.start":
                state.started = True
                if state.expects_body and not state.complete:
                    # Answered without reading the whole body: close, rather than read the rest of it
                    # (uvicorn would, byte by byte, for as long as the client cares to send).
                    message = {**message, "headers": [*message.get("headers", []), (b"connection", b"close")]}
            await send(message)

        try:
            await self.app(scope, limited_receive, guarded_send)
        except _Refused:
            pass
        if state.refused and not state.started:
            await self._refuse(scope, send, state.refused)

    async def _refuse(self, scope: dict[str, Any], send: Any, status: int) -> None:
        reason = (f"request body larger than {format_size(self.max_body)}" if status == 413
                  else f"request body not received within {self.timeout:g}s")
        client = scope.get("client") or (None,)
        # The path is cut to its first segment: an unsubscribe URL carries its token.
        log.warning("request_refused", status=status, reason=reason, method=scope["method"],
                    path="/" + scope["path"].lstrip("/").split("/", 1)[0], client=client[0])
        body = f"{reason}\n".encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                                (b"content-length", str(len(body)).encode()), (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})


@dataclass
class _BodyState:
    expects_body: bool
    received: int = 0
    complete: bool = False
    refused: int = 0
    started: bool = False


def _framing(scope: Mapping[str, Any]) -> tuple[int | None, bool]:
    """(declared Content-Length or None, chunked). h11 has already refused malformed framing."""
    declared, chunked = None, False
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                declared = int(value)
            except ValueError:
                declared = None
        elif name == b"transfer-encoding":
            chunked = True
    return declared, chunked


_TOO_MANY = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nContent-Length: 48\r\n"
             b"Connection: close\r\nRetry-After: 5\r\n\r\ntoo many connections from this address at once\r\n")


def limited_protocol(timeout: float, per_client: int,
                     is_proxy: Callable[[str | None], bool] = lambda address: False) -> type[H11Protocol]:
    """uvicorn's h11 protocol, closing a connection whose request head takes over ``timeout``
    seconds, and refusing one client address more than ``per_client`` connections at once
    (``is_proxy``: addresses not counted).

    The head's clock starts when the connection opens, and on a kept-alive connection at the first
    byte of the next request (an idle one is uvicorn's keep-alive timeout's to close). It stops
    when h11 has the whole head; the body is :class:`BodyLimit`'s.
    """
    open_by_client: Counter[str] = Counter()  # one event loop: no lock needed

    class LimitedProtocol(H11Protocol):
        _head_deadline: asyncio.TimerHandle | None = None
        _client: str | None = None
        _refused = False

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            peer = transport.get_extra_info("peername")
            client = peer[0] if isinstance(peer, tuple) and peer else None
            if client is not None and not is_proxy(client):
                if open_by_client[client] >= per_client:
                    # Before uvicorn counts it: the refusal costs none of max_connections.
                    log.warning("connection_refused", client=client, reason="max_connections_per_client",
                                limit=per_client)
                    transport.write(_TOO_MANY)
                    transport.close()
                    self._refused = True
                    return
                open_by_client[client] += 1
                self._client = client
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            if self.conn.their_state is h11.IDLE and self._head_deadline is None:
                self._arm()
            super().data_received(data)
            if self.conn.their_state is not h11.IDLE:
                self._disarm()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._refused:
                return  # refused in connection_made: uvicorn never knew it
            if self._client is not None:
                open_by_client[self._client] -= 1
                if open_by_client[self._client] <= 0:
                    del open_by_client[self._client]
                self._client = None
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._disarm()
            self._head_deadline = self.loop.call_later(timeout, self._head_too_slow)

        def _disarm(self) -> None:
            if self._head_deadline is not None:
                self._head_deadline.cancel()
                self._head_deadline = None

        def _head_too_slow(self) -> None:
            self._head_deadline = None
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                self.transport.close()

    return LimitedProtocol
