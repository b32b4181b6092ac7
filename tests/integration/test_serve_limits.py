"""`senddock serve` under hostile input: a real `senddock serve` process, raw sockets as clients.

Oversized bodies (declared and chunked), slow heads and bodies, more connections than allowed,
malformed webhook documents and oversized unsubscribe forms. Memory is read from the server's
/proc/PID/status: VmHWM (the peak), after resetting it through /proc/PID/clear_refs.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from tests_support import senddock_executable, wait_for

from senddock.api import Senddock
from senddock.mail.unsubscribe import make_token
from senddock.sink import free_port
from senddock.testing import fast_settings

MIB = 1024 * 1024
SECRET = "a-long-unsubscribe-secret-for-tests"
TOPIC = "arn:aws:sns:us-east-1:123:ses"


@dataclass
class Server:
    process: subprocess.Popen
    port: int
    config_path: Path

    def get(self, path: str = "/healthz", timeout: float = 10) -> int:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=timeout) as response:
                return response.status
        except urllib.error.HTTPError as exc:
            return exc.code

    def memory(self) -> dict[str, int]:
        """VmRSS and VmHWM (peak) in KiB."""
        fields = {}
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            name, _, value = line.partition(":")
            if name in ("VmRSS", "VmHWM"):
                fields[name] = int(value.split()[0])
        return fields

    def reset_peak(self) -> None:
        Path(f"/proc/{self.process.pid}/clear_refs").write_text("5")  # VmHWM := VmRSS


@pytest.fixture
def serve(make_config, database_dsn, tmp_path, monkeypatch) -> Iterator:
    """start(**serve_settings): a running `senddock serve` with those settings."""
    servers: list[tuple[Server, object]] = []

    def start(**settings) -> Server:
        port = free_port("127.0.0.1")
        config = make_config(fast_settings(serve={"port": port, "sns_topic_arns": [TOPIC], **settings},
                                           unsubscribe={"secret": "${UNSUB_SECRET}"}), name=f"serve-{port}.yaml")
        log = open(tmp_path / f"serve-{port}.log", "wb")  # a file, not a pipe nobody drains
        env = {**os.environ, "UNSUB_SECRET": SECRET, "SENDDOCK_DATABASE_URL": database_dsn}
        process = subprocess.Popen([senddock_executable(), "serve", "-c", str(config.path)], env=env,
                                   stdout=subprocess.DEVNULL, stderr=log)
        server = Server(process, port, config.path)
        servers.append((server, log))

        def healthy() -> bool:
            assert process.poll() is None, (tmp_path / f"serve-{port}.log").read_text()
            try:
                return server.get(timeout=2) == 200
            except OSError:
                return False

        wait_for(healthy, 30, "senddock serve")
        return server

    monkeypatch.setenv("UNSUB_SECRET", SECRET)  # make_config loads the file in this process too
    try:
        yield start
    finally:
        for server, log in servers:
            server.process.terminate()
            code = server.process.wait(20)
            log.close()
            assert code == 0, Path(log.name).read_text()[-3000:]


def post_streaming(port: int, path: str, headers: dict[str, str], body: Iterator[bytes],
                   timeout: float = 60) -> tuple[str, float, int]:
    """POST ``body`` while reading the answer, as curl does: (status line, seconds to it, bytes sent).

    A client that sends its whole body before reading would only see the connection closed.
    """
    sock = socket.create_connection(("127.0.0.1", port))
    head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    sock.sendall(head.encode() + b"\r\n")
    sent = [0]

    def pump() -> None:
        try:
            for chunk in body:
                sock.sendall(chunk)
                sent[0] += len(chunk)
        except OSError:
            pass  # the server closed the connection: what a refusal does

    pumping = threading.Thread(target=pump, daemon=True)
    started = time.monotonic()
    pumping.start()
    sock.settimeout(timeout)
    answer = b""
    try:
        while b"\r\n" not in answer:
            data = sock.recv(4096)
            if not data:
                break
            answer += data
    finally:
        took = time.monotonic() - started
        sock.close()
        pumping.join(10)
    return answer.split(b"\r\n", 1)[0].decode("latin-1"), took, sent[0]


def zeros(total: int, chunk: int = MIB) -> Iterator[bytes]:
    block = b"0" * chunk
    for _ in range(total // chunk):
        yield block


def chunked(parts: Iterator[bytes]) -> Iterator[bytes]:
    for part in parts:
        yield b"%x\r\n%s\r\n" % (len(part), part)
    yield b"0\r\n\r\n"


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_a_256_mib_post_is_refused_at_once_and_costs_no_memory(serve, framing):
    server = serve()
    assert server.get() == 200  # warm: the first request's allocations are not the POST's
    server.reset_peak()
    before = server.memory()["VmRSS"]
    if framing == "content-length":
        headers, body = {"Content-Length": str(256 * MIB)}, zeros(256 * MIB)
    else:
        headers, body = {"Transfer-Encoding": "chunked"}, chunked(zeros(256 * MIB))
    status, took, sent = post_streaming(server.port, "/webhooks/ses", {"Content-Type": "text/plain", **headers}, body)

    assert status == "HTTP/1.1 413 Request Entity Too Large"
    assert took < 10  # at once; before, only after the whole body (and 513 MiB) had been taken
    assert sent < 64 * MIB  # the rest was never read: the connection was closed
    growth = server.memory()["VmHWM"] - before
    assert growth < 8 * 1024, f"the server's peak RSS grew by {growth} KiB"
    assert server.get() == 200


def drip(port: int, first: bytes, until: float) -> str:
    """Send ``first``, then one byte every 0.2 s until the server answers or closes: what it did."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.settimeout(0.2)
    try:
        sock.sendall(first)
        while time.monotonic() < until:
            try:
                data = sock.recv(4096)
                return data.split(b"\r\n", 1)[0].decode("latin-1") if data else "closed"
            except TimeoutError:
                pass
            try:
                sock.send(b"x")
            except OSError:
                return "closed"
        return "still open"
    except ConnectionResetError:
        return "closed"
    finally:
        sock.close()


def test_slow_heads_and_bodies_are_cut_off_while_others_are_answered(serve):
    # Every connection here comes from 127.0.0.1: the per-client cap (test_hostile_clients) is
    # raised past the 31 this test opens, so what it shows is the deadlines alone.
    server = serve(header_timeout="1s", body_timeout="2s", max_connections_per_client=100)
    until = time.monotonic() + 30
    slow_head = b"POST /webhooks/ses HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "  # never ends
    slow_body = b"POST /webhooks/ses HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100000\r\n\r\n{"
    with concurrent.futures.ThreadPoolExecutor(max_workers=30) as pool:
        heads = [pool.submit(drip, server.port, slow_head, until) for _ in range(20)]
        bodies = [pool.submit(drip, server.port, slow_body, until) for _ in range(10)]
        time.sleep(0.5)
        # Meanwhile, another client is answered at once.
        for _ in range(3):
            started = time.monotonic()
            assert server.get(timeout=5) == 200
            assert time.monotonic() - started < 5
        head_results = [f.result() for f in heads]
        body_results = [f.result() for f in bodies]
    assert head_results == ["closed"] * 20  # before: "still open" after 30 s
    assert body_results == ["HTTP/1.1 408 Request Timeout"] * 10
    assert server.get() == 200


def test_connections_beyond_max_connections_get_503_until_the_slow_ones_are_cut(serve):
    server = serve(max_connections=5, header_timeout="2s")
    idle = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(5)]
    try:
        time.sleep(0.3)
        assert server.get(timeout=5) == 503  # refused at once, not queued
        wait_for(lambda: server.get(timeout=5) == 200, 20, "the idle connections to be closed")
        assert all(s.recv(1) == b"" for s in idle)
    finally:
        for s in idle:
            s.close()


def post(server: Server, path: str, body: bytes, content_type: str) -> int:
    request = urllib.request.Request(f"http://127.0.0.1:{server.port}{path}", data=body, method="POST",
                                     headers={"Content-Type": content_type})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_malformed_webhook_bodies_are_400_not_500(serve):
    server = serve()
    envelope = {"Type": "Notification", "MessageId": "m", "TopicArn": TOPIC, "Message": "{}",
                "Timestamp": "2026-12-02T10:00:00Z", "SignatureVersion": "2", "Signature": "AAAA",
                "SigningCertURL": "https://sns.us-east-1.amazonaws.com/cert.pem"}
    bodies = {
        "empty": b"",
        "not JSON": b"{not json",
        "not UTF-8": b"\xff\xfe\x00{",
        "an array": b"[1, 2]",
        "nested 100,000 deep": b"[" * 100_000,
        "TopicArn not a string": json.dumps({**envelope, "TopicArn": [TOPIC]}).encode(),
        "Type not a string": json.dumps({**envelope, "Type": {"x": 1}}).encode(),
        "Signature not a string": json.dumps({**envelope, "Signature": 7}).encode(),
    }
    answers = {name: post(server, "/webhooks/ses", body, "text/plain; charset=UTF-8") for name, body in bodies.items()}
    assert answers == {name: 400 for name in bodies}
    assert server.get() == 200


def test_an_oversized_or_odd_unsubscribe_form_is_refused_and_unsubscribes_nobody(serve, make_config):
    server = serve()
    app = Senddock(make_config(fast_settings(unsubscribe={"secret": "${UNSUB_SECRET}"}), name="app.yaml"))
    try:
        app.create_list("news")
        subscriber = app.add_subscriber("ada@example.com", lists=["news"])
        path = f"/unsubscribe/{make_token(SECRET, subscriber, 1)}"
        one_click = b"List-Unsubscribe=One-Click"
        form = "application/x-www-form-urlencoded"

        padded = one_click + b"&pad=" + b"x" * MIB
        status, _, _ = post_streaming(server.port, path, {"Content-Type": form,
                                                          "Content-Length": str(len(padded))}, iter([padded]))
        assert status == "HTTP/1.1 413 Request Entity Too Large"
        # Streamed without a length, the form parser refuses the long field before the cap is reached.
        status, took, sent = post_streaming(server.port, path, {"Content-Type": form, "Transfer-Encoding": "chunked"},
                                            chunked(zeros(256 * MIB, 65536)))
        assert (status, took < 10, sent < 64 * MIB) == ("HTTP/1.1 400 Bad Request", True, True)
        many_fields = one_click + b"".join(b"&f%d=1" % i for i in range(200))  # 2 KiB, under max_body
        assert post(server, path, many_fields, form) == 400
        big_field = one_click + b"&pad=" + b"x" * 8192
        assert post(server, path, big_field, form) == 400
        multipart = (b"--b\r\nContent-Disposition: form-data; name=\"List-Unsubscribe\"\r\n\r\nOne-Click\r\n"
                     b"--b\r\nContent-Disposition: form-data; name=\"f\"; filename=\"a.bin\"\r\n\r\nxyz\r\n--b--\r\n")
        assert post(server, path, multipart, "multipart/form-data; boundary=b") == 400
        with app.db.connection() as conn:
            assert conn.execute("SELECT status FROM subscribers").fetchone() == ("active",)

        assert post(server, path, one_click, form) == 200  # RFC 8058's one field still works
        with app.db.connection() as conn:
            assert conn.execute("SELECT status FROM subscribers").fetchone() == ("unsubscribed",)
    finally:
        app.close()
