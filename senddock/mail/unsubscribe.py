"""Unsubscribe tokens: which subscriber (and from which campaign), signed with an HMAC.

A token is verifiable without a database lookup and cannot be forged or altered without the
secret (``unsubscribe.secret``, from the environment). It carries no address, so a forwarded
message does not leak one, and it never expires: RFC 8058 one-click links are followed by mail
providers long after the send.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from senddock.config import UnsubscribeSettings

_CONTEXT = b"senddock-unsubscribe-v1:"  # a token signed for this purpose can serve no other
_MAC_BYTES = 16  # 128 bits: far beyond guessing, half the length of a full SHA-256


class BadToken(ValueError):
    """A token that is malformed or whose signature does not match."""


@dataclass(frozen=True)
class UnsubscribeToken:
    subscriber_id: int
    campaign_id: int


def _mac(secret: str, payload: bytes) -> bytes:
    return hmac.new(secret.encode("utf-8"), _CONTEXT + payload, hashlib.sha256).digest()[:_MAC_BYTES]


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def make_token(secret: str, subscriber_id: int, campaign_id: int) -> str:
    payload = f"{subscriber_id}.{campaign_id}".encode("ascii")
    return f"{_b64(payload)}.{_b64(_mac(secret, payload))}"


def read_token(secret: str, token: str) -> UnsubscribeToken:
    """The token's subscriber and campaign; :class:`BadToken` when it was not made with ``secret``."""
    try:
        payload_part, mac_part = token.split(".")
        payload, mac = _unb64(payload_part), _unb64(mac_part)
    except ValueError:  # wrong shape, bad base64 (binascii.Error is a ValueError)
        raise BadToken("malformed token") from None
    if _b64(payload) != payload_part or _b64(mac) != mac_part:
        # The same bytes written another way (padding bits set, "=" kept): one token, one spelling.
        raise BadToken("malformed token: not its canonical form")
    if not hmac.compare_digest(mac, _mac(secret, payload)):
        raise BadToken("the token's signature does not match")
    subscriber, _, campaign = payload.decode("ascii").partition(".")
    return UnsubscribeToken(int(subscriber), int(campaign))


def unsubscribe_url(base_url: str, token: str) -> str:
    """Where `senddock serve` answers: ``{unsubscribe.url}/unsubscribe/{token}``."""
    return f"{base_url.rstrip('/')}/unsubscribe/{token}"


def missing_links(settings: UnsubscribeSettings) -> str | None:
    """Why messages sent with this ``unsubscribe`` config section carry no List-Unsubscribe header,
    or None when they do. Gmail and Yahoo require one-click unsubscribe (RFC 8058) of bulk senders:
    `campaign send` refuses without it, `check-config` warns."""
    if settings.configured:
        return None
    return ("no unsubscribe link is configured: messages would go out without a List-Unsubscribe header, "
            "which Gmail and Yahoo require of bulk senders (one-click, RFC 8058); set unsubscribe.url (the "
            "public https:// address of `senddock serve`) and unsubscribe.secret (see "
            "docs/configuration.md#unsubscribe)")
