"""One POST to a receiver, with a hard deadline, no redirects followed and the reply read for a
few KiB at most: whatever the receiver does, a delivery ends within its timeout.

The stdlib's http.client, not urllib or httpx: it follows no redirect by itself, lets the reply's
body be read for a capped number of bytes, and needs nothing installed; the one thing it lacks, a
deadline on the whole exchange (its timeout is per socket operation, so a receiver dribbling a
byte a second would hold it for ever), is a timer that shuts the socket (senddock.http_deadline, shared with the SNS certificate fetch).
"""

from __future__ import annotations

import base64
import http.client
import socket
import ssl
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from senddock.http_deadline import ExchangeDeadline
from senddock.config.webhooks import shown_url

# The reply's body is kept for the last error only: a receiver's 50 MB answer is never read.
READ_CAP = 2048


@dataclass(frozen=True)
class Reply:
    status: int | None  # None: no HTTP answer (connection, TLS, timeout)
    error: str | None  # None: delivered (2xx)
    retry_after: float | None = None  # seconds the receiver asked for (429, 503)
    gone: bool = False  # 410: the receiver wants no more events


_default_context: ssl.SSLContext | None = None


def _tls() -> ssl.SSLContext:
    global _default_context
    if _default_context is None:  # loads the system's CAs once (SSL_CERT_FILE is honoured)
        _default_context = ssl.create_default_context()
    return _default_context


def post(url: str, body: bytes, headers: dict[str, str], timeout: float) -> Reply:
    parts = urlsplit(url)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    if parts.username is not None:  # https://user:password@host/...: HTTP basic authentication
        credentials = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
        headers = {**headers, "authorization": "Basic " + base64.b64encode(credentials).decode()}
    if parts.scheme == "https":
        conn: http.client.HTTPConnection = http.client.HTTPSConnection(
            parts.hostname, parts.port, timeout=timeout, context=_tls())
    else:
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    with ExchangeDeadline(conn, timeout) as deadline:
        return _exchange(url, conn, deadline, path, body, headers, timeout)


def _exchange(url: str, conn: http.client.HTTPConnection, deadline: ExchangeDeadline, path: str, body: bytes,
              headers: dict[str, str], timeout: float) -> Reply:
    expired = deadline.expired
    try:
        deadline.connect()
        conn.request("POST", path, body=body, headers={"content-type": "application/json",
                                                       "user-agent": "senddock-webhooks", **headers})
        response = conn.getresponse()
        status = response.status
        text = response.read(READ_CAP) if not 200 <= status < 300 else b""
        if expired.is_set():
            raise TimeoutError
        return _judge(url, status, response, text)
    except ssl.SSLCertVerificationError as exc:
        return Reply(None, f"TLS failure: certificate verify failed: {exc.verify_message or exc.reason}")
    except ssl.SSLError as exc:
        return Reply(None, f"TLS failure: {exc.reason or exc}")
    except (TimeoutError, socket.timeout):
        return Reply(None, f"timed out after {timeout:g}s")
    except (OSError, http.client.HTTPException) as exc:
        if expired.is_set():
            return Reply(None, f"timed out after {timeout:g}s")
        return Reply(None, _os_error(exc))
    finally:
        conn.close()


def _judge(url: str, status: int, response: http.client.HTTPResponse, text: bytes) -> Reply:
    if 200 <= status < 300:
        return Reply(status, None)
    snippet = " ".join(text.decode("utf-8", "replace").split())[:300]
    reason = f"HTTP {status} {response.reason}".strip() + (f": {snippet}" if snippet else "")
    if 300 <= status < 400:
        location = response.getheader("location") or "nowhere"
        return Reply(status, f"HTTP {status} redirect to {shown_url(location) if '://' in location else location} "
                             "not followed (point the webhook at the final URL)")
    if status == 410:
        return Reply(status, reason, gone=True)
    return Reply(status, reason, retry_after=_retry_after(response.getheader("retry-after")))


def _retry_after(value: str | None) -> float | None:
    """Seconds only (an HTTP date is rare from a webhook receiver); capped at a day."""
    try:
        return min(max(float(value), 0.0), 86400.0) if value else None
    except ValueError:
        return None


def _os_error(exc: BaseException) -> str:
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, socket.gaierror):
        return f"cannot resolve the host: {exc.strerror or exc}"
    if isinstance(exc, http.client.HTTPException):
        return f"bad HTTP reply: {type(exc).__name__} {exc}".strip()
    return getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
