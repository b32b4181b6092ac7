"""Fetching SNS signing certificates from a hostile or slow server: a local HTTP(S) server that
drips, floods, fails or answers late, and a Verifier allowed to fetch from it."""

from __future__ import annotations

import base64
import concurrent.futures
import datetime
import http.server
import ssl
import threading
import time
from collections.abc import Iterator

import pytest
import trustme
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.x509.oid import NameOID

from senddock.web.fetch import FetchError, fetch_small
from senddock.web.sns import CertificateUnavailable, SignatureError, Verifier, string_to_sign

MIB = 1024 * 1024


def key_and_certificate() -> tuple[rsa.RSAPrivateKey, bytes]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "sns.amazonaws.com")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now)
            .not_valid_after(now + datetime.timedelta(days=1)).sign(key, hashes.SHA256()))
    return key, cert.public_bytes(serialization.Encoding.PEM)


KEY, PEM = key_and_certificate()


def signed_by(url: str) -> dict:
    message = {"Type": "Notification", "MessageId": "m1", "TopicArn": "arn:aws:sns:us-east-1:1:t", "Message": "hi",
               "Timestamp": "2026-12-02T10:00:00Z", "SignatureVersion": "2", "SigningCertURL": url}
    signature = KEY.sign(string_to_sign(message), padding.PKCS1v15(), hashes.SHA256())
    return {**message, "Signature": base64.b64encode(signature).decode()}


class Handler(http.server.BaseHTTPRequestHandler):
    """GET /drip-head, /drip-body, /flood, /flood-chunked, /late-cert, /cert, anything else 404."""

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        self.server.requests.append(self.path)
        try:
            self.answer()
        except OSError:
            pass  # the client hung up: what a bounded fetch does

    def answer(self) -> None:
        path = self.path.split("?", 1)[0]  # a query only makes distinct URLs
        if path == "/drip-head":  # a byte of the status line every 0.1 s, for up to a minute
            for byte in b"HTTP/1.1 200 OK\r\n" + b"X-Slow: " + b"x" * 600:
                self.wfile.write(bytes([byte]))
                self.wfile.flush()
                time.sleep(0.1)
        elif path == "/drip-body":
            self.send_response(200)
            self.send_header("Content-Length", str(len(PEM)))
            self.end_headers()
            for byte in PEM:
                self.wfile.write(bytes([byte]))
                self.wfile.flush()
                time.sleep(0.1)
        elif path in ("/flood", "/flood-chunked"):
            self.send_response(200)
            if path == "/flood":
                self.send_header("Content-Length", str(100 * MIB))
            self.end_headers()
            for _ in range(100):
                self.wfile.write(b"x" * MIB)
                self.server.sent += MIB
        elif path in ("/cert", "/late-cert"):
            if path == "/late-cert":
                time.sleep(0.5)
            self.send_response(200)
            self.send_header("Content-Length", str(len(PEM)))
            self.end_headers()
            self.wfile.write(PEM)
        else:
            self.send_error(404)


class LocalServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.requests: list[str] = []
        self.sent = 0
        if tls is not None:
            self.socket = tls.wrap_socket(self.socket, server_side=True)
        self.scheme = "https" if tls else "http"

    def url(self, path: str) -> str:
        return f"{self.scheme}://127.0.0.1:{self.server_address[1]}{path}"


def running(server: LocalServer) -> Iterator[LocalServer]:
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def server() -> Iterator[LocalServer]:
    yield from running(LocalServer())


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def tls_server(ca) -> Iterator[LocalServer]:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    yield from running(LocalServer(context))


def timed_failure(call) -> tuple[str, float]:
    started = time.monotonic()
    with pytest.raises((FetchError, CertificateUnavailable)) as caught:
        call()
    return str(caught.value), time.monotonic() - started


@pytest.mark.parametrize("path", ["/drip-head", "/drip-body"])
def test_a_dripping_server_cannot_hold_a_fetch_past_its_timeout(server, path):
    # Every read gets a byte within 0.1 s, so a per-read timeout of 1 s never fires.
    why, took = timed_failure(lambda: fetch_small(server.url(path), timeout=1, max_size=64 * 1024))
    assert why == "took longer than 1s"
    assert took < 4


def test_the_deadline_holds_over_tls_too(tls_server, ca):
    client = ssl.create_default_context()
    ca.configure_trust(client)
    assert fetch_small(tls_server.url("/cert"), timeout=5, max_size=64 * 1024, ssl_context=client) == PEM
    why, took = timed_failure(lambda: fetch_small(tls_server.url("/drip-body"), timeout=1, max_size=64 * 1024,
                                                  ssl_context=client))
    assert (why, took < 4) == ("took longer than 1s", True)


@pytest.mark.parametrize("path", ["/flood", "/flood-chunked"])
def test_a_document_over_the_size_limit_is_refused_without_reading_it(server, path):
    why, took = timed_failure(lambda: fetch_small(server.url(path), timeout=10, max_size=64 * 1024))
    assert why.startswith("larger than 65536 bytes")
    time.sleep(0.2)
    assert server.sent < 16 * MIB  # the server could not push the 100 MiB: the client hung up


def test_a_failed_fetch_is_remembered_for_a_while(server):
    verifier = Verifier(url_allowed=lambda url: True, timeout=1, failure_ttl=1.0)
    url = server.url("/drip-body")
    why, took = timed_failure(lambda: verifier.verify(signed_by(url)))
    assert why == "cannot fetch the signing certificate: took longer than 1s" and took < 4
    for _ in range(20):  # a flood of forged messages naming the same URL: answered at once
        why, took = timed_failure(lambda: verifier.verify(signed_by(url)))
        assert took < 0.5 and "failed recently" in why
    assert server.requests == ["/drip-body"]
    time.sleep(1.1)
    timed_failure(lambda: verifier.verify(signed_by(url)))
    assert server.requests == ["/drip-body", "/drip-body"]  # tried again once the failure is stale


def test_concurrent_messages_naming_one_url_share_one_fetch(server):
    verifier = Verifier(url_allowed=lambda url: True, timeout=5)
    message = signed_by(server.url("/late-cert"))
    with concurrent.futures.ThreadPoolExecutor(max_workers=10) as pool:
        results = list(pool.map(lambda _: verifier.verify(message), range(10)))
    assert results == [None] * 10  # all verified
    assert server.requests == ["/late-cert"]
    verifier.verify(message)  # cached
    assert server.requests == ["/late-cert"]


def test_only_a_few_urls_are_fetched_at_once_the_rest_refused_at_once(server):
    verifier = Verifier(url_allowed=lambda url: True, timeout=2, max_fetches=2)
    slow = [signed_by(server.url(f"/drip-body?{i}")) for i in range(2)]
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        fetching = [pool.submit(verifier.verify, m) for m in slow]
        time.sleep(0.5)
        why, took = timed_failure(lambda: verifier.verify(signed_by(server.url("/cert"))))
        assert (why, took < 0.5) == ("too many signing certificates being fetched at once", True)
        for future in fetching:
            with pytest.raises(CertificateUnavailable):
                future.result()
    verifier.verify(signed_by(server.url("/cert")))  # the slots are free again


def test_a_url_off_sns_is_a_signature_error_and_never_fetched(server):
    with pytest.raises(SignatureError, match="not an SNS host"):
        Verifier(timeout=1).verify(signed_by(server.url("/cert")))
    assert server.requests == []
