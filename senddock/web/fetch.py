"""GET a small document over HTTP(S) within a bound on the whole time and on its size.

urllib's ``timeout`` bounds each socket operation, not the fetch, and ``read()`` takes whatever
size it is sent. Here the whole exchange has a deadline (senddock.http_deadline) and the body is
read up to one byte past the limit.
"""

from __future__ import annotations

import http.client
import ssl
from urllib.parse import urlparse

from senddock.http_deadline import ExchangeDeadline


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
    with ExchangeDeadline(conn, timeout) as deadline:
        return _get(conn, parsed, deadline, timeout=timeout, max_size=max_size)


def _get(conn: http.client.HTTPConnection, parsed, deadline: ExchangeDeadline, *, timeout: float,
         max_size: int) -> bytes:
    expired = deadline.expired
    try:
        deadline.connect()
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
        conn.close()
