"""GET a small document over HTTP(S) within a bound on the whole time and on its size.

urllib's ``timeout`` bounds each socket operation, not the fetch: a server sending one byte a
second, in its headers or its body, keeps ``urlopen(url, timeout=5).read()`` going for as long as
it likes, and ``read()`` takes whatever size it is sent. Here a watchdog shuts the socket down at
the deadline, which wakes the read blocked on it, and the body is read up to one byte past the
limit. Name resolution is not covered by the watchdog (there is no socket yet); the resolver's
own timeouts bound it.
"""

from __future__ import annotations

import http.client
import socket
import ssl
import threading
from urllib.parse import urlparse


class FetchError(Exception):
    """The document could not be had within the bounds (or at all)."""


def fetch_small(url: str, *, timeout: float, max_size: int, ssl_context: ssl.SSLContext | None = None) -> bytes:
    """The body of ``GET url``: status 200, at most ``max_size`` bytes, within ``timeout`` seconds
    from start to end (connect, TLS, headers and body). Raises :class:`FetchError` otherwise."""
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise FetchError(f"not an http(s) URL: {url!r}")
    if parsed.scheme == "https":
        conn: http.client.HTTPConnection = http.client.HTTPSConnection(
            parsed.hostname, parsed.port, timeout=timeout, context=ssl_context or ssl.create_default_context())
    else:
        conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=timeout)
    expired = threading.Event()
    # The connection's socket, kept here: http.client drops conn.sock once a response says it will
    # close, while the response goes on reading from it.
    connected: list[socket.socket] = []

    def expire() -> None:
        expired.set()
        # conn.sock too: during a TLS handshake it is the plain socket the handshake reads from.
        for sock in {*connected, conn.sock} - {None}:
            try:
                # The plain socket's shutdown, also under TLS: SSLSocket.shutdown would drop the
                # SSL object under the thread that is reading with it.
                socket.socket.shutdown(sock, socket.SHUT_RDWR)
            except OSError:
                pass

    watchdog = threading.Timer(timeout, expire)
    watchdog.daemon = True
    watchdog.start()
    try:
        conn.connect()
        connected.append(conn.sock)
        if expired.is_set():  # the deadline passed while connecting
            raise FetchError(f"took longer than {timeout:g}s")
        conn.request("GET", (parsed.path or "/") + (f"?{parsed.query}" if parsed.query else ""),
                     headers={"User-Agent": "senddock", "Accept": "*/*"})
        response = conn.getresponse()
        if response.status != 200:
            raise FetchError(f"HTTP {response.status} from {parsed.hostname}")
        declared = response.getheader("Content-Length")
        if declared and declared.isdigit() and int(declared) > max_size:
            raise FetchError(f"larger than {max_size} bytes ({declared} declared)")
        body = response.read(max_size + 1)
        if len(body) > max_size:
            raise FetchError(f"larger than {max_size} bytes")
        if expired.is_set():
            raise FetchError(f"took longer than {timeout:g}s")
        return body
    except (OSError, http.client.HTTPException) as exc:
        if expired.is_set():
            raise FetchError(f"took longer than {timeout:g}s") from None
        raise FetchError(str(exc) or type(exc).__name__) from None
    finally:
        watchdog.cancel()
        conn.close()
