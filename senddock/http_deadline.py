"""A deadline on a whole http.client exchange: connect, TLS handshake, request, reply.

http.client's ``timeout`` bounds each socket operation, not the exchange: a peer sending one byte
a second, in its headers or its body, keeps a request going for as long as it likes. A watchdog
timer shuts the socket down at the deadline, which wakes whatever read or write is blocked on it.
Name resolution is not covered (there is no socket yet); the resolver's own timeouts bound it.
Used by the SNS certificate fetch (senddock.web.fetch) and the webhook POST (senddock.webhooks.http).
"""

from __future__ import annotations

import http.client
import socket
import threading


class ExchangeDeadline:
    """``with ExchangeDeadline(conn, timeout) as deadline: deadline.connect(); ...``; once the
    deadline passed, ``deadline.expired`` is set and every blocked socket call fails."""

    def __init__(self, conn: http.client.HTTPConnection, timeout: float) -> None:
        self.conn = conn
        self.expired = threading.Event()
        # The connection's socket, kept here: http.client drops conn.sock once a response says it
        # will close, while the response goes on reading from it.
        self._connected: list[socket.socket] = []
        self._timer = threading.Timer(timeout, self._expire)
        self._timer.daemon = True

    def __enter__(self) -> ExchangeDeadline:
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._timer.cancel()

    def connect(self) -> None:
        """Connect (and shake hands, under TLS) now, so the socket is known to the watchdog."""
        self.conn.connect()
        self._connected.append(self.conn.sock)

    def _expire(self) -> None:
        self.expired.set()
        # conn.sock too: during a TLS handshake it is the plain socket the handshake reads from.
        for sock in {*self._connected, self.conn.sock} - {None}:
            try:
                # The plain socket's shutdown, also under TLS: SSLSocket.shutdown would drop the
                # SSL object under the thread that is reading with it.
                socket.socket.shutdown(sock, socket.SHUT_RDWR)
            except OSError:
                pass
