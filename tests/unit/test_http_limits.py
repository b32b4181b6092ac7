"""BodyLimit as a plain ASGI callable: what the app sees and what the client gets back."""

from __future__ import annotations

import asyncio
from typing import Any

from senddock.web.http_limits import BodyLimit, HttpLimits


def call(middleware: BodyLimit, headers: list[tuple[bytes, bytes]], messages: list[dict[str, Any]],
         delay: float = 0) -> list[dict[str, Any]]:
    """Run one request through ``middleware``: the messages it sent back."""
    scope = {"type": "http", "method": "POST", "path": "/unsubscribe/secret-token", "headers": headers,
             "client": ("127.0.0.1", 5000)}
    queue = list(messages)
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        await asyncio.sleep(delay)
        return queue.pop(0) if queue else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(middleware(scope, receive, send))
    return sent


def reading_app(seen: list[bytes], swallow: bool = False):
    """An app that reads the whole body and answers 200; with ``swallow``, it catches everything."""

    async def app(scope, receive, send):
        try:
            body = b""
            while True:
                message = await receive()
                body += message.get("body", b"")
                if not message.get("more_body"):
                    break
            seen.append(body)
        except Exception:
            if not swallow:
                raise
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    return app


def chunks(*sizes: int) -> list[dict[str, Any]]:
    return [{"type": "http.request", "body": b"x" * n, "more_body": i < len(sizes) - 1} for i, n in enumerate(sizes)]


def status_of(sent: list[dict[str, Any]]) -> tuple[int, bool]:
    start = sent[0]
    return start["status"], (b"connection", b"close") in start["headers"]


def test_a_declared_length_over_the_cap_is_refused_without_calling_the_app():
    seen: list[bytes] = []
    sent = call(BodyLimit(reading_app(seen), max_body=1000, timeout=5), [(b"content-length", b"1001")], chunks(1001))
    assert status_of(sent) == (413, True)
    assert seen == []


def test_a_chunked_body_is_refused_the_moment_it_passes_the_cap_even_if_the_app_swallows_errors():
    seen: list[bytes] = []
    app = BodyLimit(reading_app(seen, swallow=True), max_body=1000, timeout=5)
    sent = call(app, [(b"transfer-encoding", b"chunked")], chunks(600, 600, 600))
    assert status_of(sent) == (413, True)
    assert [m.get("body") for m in sent[1:]] == [b"request body larger than 1000B\n"]  # not the app's "ok"


def test_a_body_within_the_cap_reaches_the_app_whole():
    seen: list[bytes] = []
    sent = call(BodyLimit(reading_app(seen), max_body=1000, timeout=5), [(b"transfer-encoding", b"chunked")],
                chunks(500, 500))
    assert seen == [b"x" * 1000]
    assert status_of(sent) == (200, False)


def test_a_body_slower_than_the_timeout_is_answered_408():
    seen: list[bytes] = []
    sent = call(BodyLimit(reading_app(seen), max_body=1000, timeout=0.2), [(b"content-length", b"30")],
                chunks(10, 10, 10), delay=0.15)
    assert status_of(sent) == (408, True)
    assert seen == []


def test_an_answer_given_before_the_body_was_read_closes_the_connection():
    async def early(scope, receive, send):
        await send({"type": "http.response.start", "status": 400, "headers": []})
        await send({"type": "http.response.body", "body": b"bad link"})

    sent = call(BodyLimit(early, max_body=1000, timeout=5), [(b"content-length", b"500")], chunks(500))
    assert status_of(sent) == (400, True)  # else uvicorn would read the unread body, however slow


def test_uvicorn_is_told_to_serve_exactly_max_connections():
    limits = HttpLimits(max_body=1024, body_timeout=1, header_timeout=1, max_connections=7, keep_alive_timeout=5)
    assert limits.uvicorn_options()["limit_concurrency"] == 8  # uvicorn counts the asking connection too
