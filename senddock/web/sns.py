"""Verifying Amazon SNS HTTP(S) deliveries before anything in them is believed.

SNS signs each message (SignatureVersion 1: SHA1withRSA, 2: SHA256withRSA) over a canonical
string of its fields, with the key of the certificate at ``SigningCertURL``. That URL is
attacker-controlled until proven otherwise, so a certificate is fetched only over HTTPS from an
SNS host of amazonaws.com (``sns.<region>.amazonaws.com``), and cached. Certificates configured as
trusted for a given URL (``serve.sns_certificates``) are used instead of fetching: for tests, and
for networks that cannot reach AWS.

Forged messages cost little: a fetch is bounded in time (the whole of it, see
:mod:`senddock.web.fetch`) and size; a failed one is remembered for a minute, so a flood pointing at a
bad URL fetches it once; concurrent requests for one URL share one fetch; and only a few URLs are
fetched at once, the rest refused at once rather than queued.
"""

from __future__ import annotations

import base64
import re
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding

from senddock.web.fetch import FetchError, fetch_small

# A region's SNS endpoint only (sns.us-east-1.amazonaws.com, sns.us-gov-west-1..., sns.cn-north-1
# ...amazonaws.com.cn): a looser pattern would also match S3 bucket hosts anyone can serve from.
_SNS_HOST = re.compile(r"sns\.[a-z]{2}(-gov|-iso[a-z]?)?-[a-z]+-\d+\.amazonaws\.com(\.cn)?")
_SIGNED_FIELDS = {
    "Notification": ("Message", "MessageId", "Subject", "Timestamp", "TopicArn", "Type"),
    "SubscriptionConfirmation": ("Message", "MessageId", "SubscribeURL", "Timestamp", "Token", "TopicArn", "Type"),
    "UnsubscribeConfirmation": ("Message", "MessageId", "SubscribeURL", "Timestamp", "Token", "TopicArn", "Type"),
}
_HASHES = {"1": hashes.SHA1, "2": hashes.SHA256}
MAX_CERTIFICATE = 64 * 1024  # SNS's certificates are under 2 KiB; a chain would still fit
FAILURE_TTL = 60.0  # seconds a failed fetch is remembered
MAX_FETCHES = 4  # different URLs fetched at once
_MAX_CACHED, _MAX_FAILURES = 100, 1000  # forged URLs must not grow the caches without end


class SignatureError(Exception):
    """The message is not provably from SNS: refuse it (403) and apply nothing."""


class CertificateUnavailable(Exception):
    """The signing certificate cannot be had now: nothing is proven either way. Answer 503, so
    SNS delivers a genuine message again later."""


def is_sns_url(url: str) -> bool:
    parsed = urlparse(url)
    return parsed.scheme == "https" and bool(parsed.hostname and _SNS_HOST.fullmatch(parsed.hostname))


def string_to_sign(message: Mapping[str, Any]) -> bytes:
    """The canonical string SNS signs: ``name\\nvalue\\n`` for each signed field present, in order."""
    kind = message.get("Type")
    fields = _SIGNED_FIELDS.get(kind) if isinstance(kind, str) else None
    if fields is None:
        raise SignatureError(f"unknown SNS message type {message.get('Type')!r}")
    out = []
    for name in fields:
        if name in message and message[name] is not None:
            out.append(f"{name}\n{message[name]}\n")
        elif name != "Subject":
            raise SignatureError(f"SNS message without {name}")
    return "".join(out).encode("utf-8")


class Verifier:
    """Verifies SNS signatures; thread-safe (``serve`` calls it from its thread pool).

    ``url_allowed`` and ``fetch`` are for tests, which serve certificates from a local server.
    """

    def __init__(
        self,
        trusted: Mapping[str, Path] | None = None,
        *,
        timeout: float = 5.0,
        url_allowed: Callable[[str], bool] = is_sns_url,
        fetch: Callable[..., bytes] = fetch_small,
        failure_ttl: float = FAILURE_TTL,
        max_fetches: int = MAX_FETCHES,
    ) -> None:
        self._trusted: dict[str, x509.Certificate] = {
            url: x509.load_pem_x509_certificate(Path(path).read_bytes()) for url, path in (trusted or {}).items()
        }
        self._timeout = timeout
        self._url_allowed = url_allowed
        self._fetch = fetch
        self._failure_ttl = failure_ttl
        self._max_fetches = max_fetches
        self._lock = threading.Lock()
        self._certificates: dict[str, x509.Certificate] = {}
        self._failures: dict[str, tuple[float, str]] = {}  # url -> (until, why)
        self._fetching: dict[str, threading.Event] = {}  # url -> set when its fetch is over

    def verify(self, message: Mapping[str, Any]) -> None:
        """Raise :class:`SignatureError` unless SNS signed ``message``, :class:`CertificateUnavailable`
        when its certificate cannot be had now."""
        algorithm = _HASHES.get(str(message.get("SignatureVersion")))
        if algorithm is None:
            raise SignatureError("unsigned, or an unknown SignatureVersion")
        try:
            signature = base64.b64decode(message["Signature"], validate=True)
        except (KeyError, TypeError, ValueError):
            raise SignatureError("no valid Signature") from None
        certificate = self._certificate(str(message.get("SigningCertURL", "")))
        try:
            certificate.public_key().verify(signature, string_to_sign(message), padding.PKCS1v15(), algorithm())
        except InvalidSignature:
            raise SignatureError("the signature does not match") from None

    def _certificate(self, url: str) -> x509.Certificate:
        if url in self._trusted:
            return self._trusted[url]
        if not self._url_allowed(url):
            raise SignatureError(f"SigningCertURL is not an SNS host of amazonaws.com: {url!r}")
        while True:
            with self._lock:
                if url in self._certificates:
                    return self._certificates[url]
                until, why = self._failures.get(url, (0.0, ""))
                if time.monotonic() < until:
                    raise CertificateUnavailable(f"{why} (failed recently; tried again after {self._failure_ttl:g}s)")
                done = self._fetching.get(url)
                if done is None:
                    if len(self._fetching) >= self._max_fetches:
                        raise CertificateUnavailable("too many signing certificates being fetched at once")
                    done = self._fetching[url] = threading.Event()
                    break
            # Another request is fetching this URL: wait for its outcome rather than fetch it too.
            if not done.wait(self._timeout + 1):
                raise CertificateUnavailable("the signing certificate is still being fetched")
        try:
            return self._fetch_certificate(url)
        finally:
            with self._lock:
                del self._fetching[url]
            done.set()

    def _fetch_certificate(self, url: str) -> x509.Certificate:
        try:
            certificate = x509.load_pem_x509_certificate(
                self._fetch(url, timeout=self._timeout, max_size=MAX_CERTIFICATE))
        except (FetchError, ValueError) as exc:
            why = f"cannot fetch the signing certificate: {exc}"
            with self._lock:
                _bounded_put(self._failures, url, (time.monotonic() + self._failure_ttl, why), _MAX_FAILURES)
            raise CertificateUnavailable(why) from None
        with self._lock:
            _bounded_put(self._certificates, url, certificate, _MAX_CACHED)
        return certificate


def _bounded_put(cache: dict[str, Any], key: str, value: Any, limit: int) -> None:
    """Insert, dropping the oldest entries past ``limit`` (dicts keep insertion order)."""
    cache.pop(key, None)
    cache[key] = value
    while len(cache) > limit:
        del cache[next(iter(cache))]
