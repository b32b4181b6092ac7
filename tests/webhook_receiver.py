"""A real webhook receiver for the tests: an HTTP(S) server on 127.0.0.1 that records every
request (headers and body as received) and answers as the test's ``answer`` function says."""

from __future__ import annotations

import json
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

SECRET = "whsec_" + "c2VuZGRvY2std2ViaG9vay10ZXN0LXNlY3JldC0zMmI="  # base64 of 32 bytes


@dataclass
class Answer:
    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0  # seconds before answering
    stream: int = 0  # bytes of body to dribble out after the headers (a huge reply)


@dataclass(frozen=True)
class Request:
    path: str
    headers: dict[str, str]
    body: bytes
    answered: int

    def events(self) -> list[dict[str, Any]]:
        parsed = json.loads(self.body)
        return parsed if isinstance(parsed, list) else [parsed]


class Receiver:
    def __init__(self, answer: Callable[[int, bytes], Answer] | None = None, *, tls: ssl.SSLContext | None = None):
        self.answer = answer or (lambda n, body: Answer())
        self.requests: list[Request] = []
        self.streamed = 0  # bytes of huge replies the client took
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", 0))
                try:
                    body = self.rfile.read(length)
                except OSError:
                    return  # the client died mid-request (a node killed with kill -9)
                if len(body) < length:
                    return  # it died between the headers and the end of the body: no request, as for any server
                with receiver.lock:
                    number = len(receiver.requests) + 1
                    answer = receiver.answer(number, body)
                    receiver.requests.append(Request(self.path, {k.lower(): v for k, v in self.headers.items()}, body,
                                                     answer.status))
                if answer.delay:
                    receiver.stopped.wait(answer.delay)
                try:
                    self.send_response(answer.status)
                    for key, value in answer.headers.items():
                        self.send_header(key, value)
                    self.send_header("content-length", str(answer.stream or len(answer.body)))
                    self.end_headers()
                    if answer.stream:
                        chunk = b"x" * 65536
                        for _ in range(answer.stream // len(chunk)):
                            if receiver.stopped.is_set():
                                break
                            self.wfile.write(chunk)
                            receiver.streamed += len(chunk)
                    else:
                        self.wfile.write(answer.body)
                except OSError:
                    pass  # the client hung up (as it should on a huge reply)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        if tls is not None:
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        self.scheme = "https" if tls is not None else "http"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.server.server_address[1]}/hooks?token=abc"

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopped.set()
        self.server.shutdown()
        self.server.server_close()

    def accepted(self) -> list[Request]:
        with self.lock:
            return [r for r in self.requests if 200 <= r.answered < 300]

    def events(self, *, accepted_only: bool = True) -> list[dict[str, Any]]:
        with self.lock:
            requests = [r for r in self.requests if not accepted_only or 200 <= r.answered < 300]
        return [e for r in requests for e in r.events()]

    def wait_for(self, predicate: Callable[[Receiver], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not predicate(self):
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}; got {len(self.requests)} requests")
            time.sleep(0.05)
