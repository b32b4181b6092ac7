"""Verifying Amazon SNS HTTP(S) deliveries before anything in them is believed.

SNS signs each message (SignatureVersion 1: SHA1withRSA, 2: SHA256withRSA) over a canonical
string of its fields, with the key of the certificate at ``SigningCertURL``. That URL is
attacker-controlled until proven otherwise, so a certificate is fetched only over HTTPS from an
SNS host of amazonaws.com (``sns.<region>.amazonaws.com``), and cached. Certificates configured as
trusted for a given URL (``serve.sns_certificates``) are used instead of fetching: for tests, and
for networks that cannot reach AWS.
"""

from __future__ import annotations

import base64
import re
import threading
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding

# A region's SNS endpoint only (sns.us-east-1.amazonaws.com, sns.us-gov-west-1..., sns.cn-north-1
# ...amazonaws.com.cn): a looser pattern would also match S3 bucket hosts anyone can serve from.
_SNS_HOST = re.compile(r"sns\.[a-z]{2}(-gov|-iso[a-z]?)?-[a-z]+-\d+\.amazonaws\.com(\.cn)?")
_SIGNED_FIELDS = {
    "Notification": ("Message", "MessageId", "Subject", "Timestamp", "TopicArn", "Type"),
    "SubscriptionConfirmation": ("Message", "MessageId", "SubscribeURL", "Timestamp", "Token", "TopicArn", "Type"),
    "UnsubscribeConfirmation": ("Message", "MessageId", "SubscribeURL", "Timestamp", "Token", "TopicArn", "Type"),
}
_HASHES = {"1": hashes.SHA1, "2": hashes.SHA256}


class SignatureError(Exception):
    """The message is not provably from SNS: refuse it (403) and apply nothing."""


def is_sns_url(url: str) -> bool:
    parsed = urlparse(url)
    return parsed.scheme == "https" and bool(parsed.hostname and _SNS_HOST.fullmatch(parsed.hostname))


def string_to_sign(message: Mapping[str, Any]) -> bytes:
    """The canonical string SNS signs: ``name\\nvalue\\n`` for each signed field present, in order."""
    fields = _SIGNED_FIELDS.get(message.get("Type"))
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
    def __init__(self, trusted: Mapping[str, Path] | None = None, *, timeout: float = 10.0) -> None:
        self._certificates: dict[str, x509.Certificate] = {
            url: x509.load_pem_x509_certificate(Path(path).read_bytes()) for url, path in (trusted or {}).items()
        }
        self._lock = threading.Lock()
        self._timeout = timeout

    def verify(self, message: Mapping[str, Any]) -> None:
        """Raise :class:`SignatureError` unless SNS signed ``message``."""
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
        with self._lock:
            cached = self._certificates.get(url)
        if cached is not None:
            return cached
        if not is_sns_url(url):
            raise SignatureError(f"SigningCertURL is not an SNS host of amazonaws.com: {url!r}")
        try:
            with urllib.request.urlopen(url, timeout=self._timeout) as response:  # noqa: S310 - https, SNS host
                certificate = x509.load_pem_x509_certificate(response.read())
        except (OSError, ValueError) as exc:
            raise SignatureError(f"cannot fetch the signing certificate: {exc}") from None
        with self._lock:
            self._certificates[url] = certificate
        return certificate
