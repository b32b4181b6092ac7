"""Standard Webhooks signatures: ``v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">``, keyed
with the bytes of the endpoint's ``whsec_<base64>`` secret; one per key, space-separated, while
keys rotate (receivers accept a request any of them verifies)."""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Sequence


def signature(key: bytes, msg_id: str, timestamp: int, body: bytes) -> str:
    mac = hmac.new(key, f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


def headers(keys: Sequence[bytes], msg_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The three headers the spec names; the timestamp is the attempt's, the id the event's."""
    return {"webhook-id": msg_id, "webhook-timestamp": str(timestamp),
            "webhook-signature": " ".join(signature(key, msg_id, timestamp, body) for key in keys)}
