"""The ``webhooks`` section, typed: one Endpoint per configured receiver, and the Subscriptions an
emitting statement takes as parameters (empty when no webhook is configured: nothing is written)."""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from senddock.durations import parse_duration
from senddock.redact import shown_url

# What an operator subscribes to -> the event's type in the payload (dotted, as the Standard
# Webhooks spec recommends: grouped by what the event is about).
EVENT_TYPES = {
    "sent": "message.sent",
    "bounced": "message.bounced",
    "complained": "message.complained",
    "unsubscribed": "subscriber.unsubscribed",
    "campaign_finished": "campaign.finished",
    "campaign_paused": "campaign.paused",
}
SECRET_PREFIX = "whsec_"
# The spec's symmetric keys are 24 to 64 random bytes.
MIN_SECRET_BYTES = 24


@dataclass(frozen=True)
class Endpoint:
    id: str  # a hash of the URL: every node with the same config shares the endpoint's rows
    url: str = ""
    events: tuple[str, ...] = ()
    secrets: tuple[bytes, ...] = ()  # the first is the current key; the others while receivers rotate
    schedule: tuple[float, ...] = ()
    max_age: float = 3 * 86400.0
    timeout: float = 15.0
    batch: int = 1
    concurrency: int = 4
    keep_delivered: float = 7 * 86400.0
    keep_dead: float = 30 * 86400.0

    @property
    def shown_url(self) -> str:
        return shown_url(self.url)

    def __repr__(self) -> str:  # never the secret
        return f"Endpoint(id={self.id!r}, url={self.shown_url!r})"


@dataclass(frozen=True)
class Subscriptions:
    """(endpoint, event) pairs, flattened into two arrays for the emitting statements."""

    endpoints: tuple[str, ...] = ()
    kinds: tuple[str, ...] = ()

    def wants(self, kind: str) -> bool:
        return kind in self.kinds

    @property
    def active(self) -> bool:
        return bool(self.kinds)

    def params(self) -> dict[str, list[str]]:
        return {"wh_endpoints": list(self.endpoints), "wh_kinds": list(self.kinds)}


NO_WEBHOOKS = Subscriptions()


def endpoint_id(url: str) -> str:
    """Stable across nodes and restarts, and no secret (a URL may carry a token)."""
    return hashlib.sha256(url.encode()).hexdigest()[:16]


def decode_secret(secret: str) -> bytes:
    """``whsec_<base64>`` -> the HMAC key; ValueError (never quoting the value) when it is not."""
    if not secret.startswith(SECRET_PREFIX):
        raise ValueError(f"must start with {SECRET_PREFIX} (whsec_<base64 key>, as Standard Webhooks libraries take it)")
    try:
        key = base64.b64decode(secret[len(SECRET_PREFIX):], validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("is not whsec_ followed by base64") from None
    if len(key) < MIN_SECRET_BYTES:
        raise ValueError(f"is too short: the key must be at least {MIN_SECRET_BYTES} random bytes "
                         "(e.g. whsec_ + `openssl rand -base64 32`)")
    return key


def _listed(secret: str | list[str]) -> list[str]:
    return secret if isinstance(secret, list) else [secret]


def endpoints(config_data: Mapping[str, Any]) -> list[Endpoint]:
    found = []
    for item in config_data.get("webhooks") or []:
        retry = item["retry"]
        found.append(Endpoint(
            id=endpoint_id(item["url"]), url=item["url"], events=tuple(item["events"]),
            secrets=tuple(decode_secret(s) for s in _listed(item["secret"])),
            schedule=tuple(parse_duration(d) for d in retry["schedule"]),
            max_age=parse_duration(retry["max_age"]), timeout=parse_duration(item["timeout"]),
            batch=item["batch"], concurrency=item["concurrency"], keep_delivered=parse_duration(item["keep_delivered"]),
            keep_dead=parse_duration(item["keep_dead"]),
        ))
    return found


def subscriptions(config_data: Mapping[str, Any]) -> Subscriptions:
    pairs = [(endpoint_id(item["url"]), kind) for item in config_data.get("webhooks") or [] for kind in item["events"]]
    return Subscriptions(tuple(e for e, _ in pairs), tuple(k for _, k in pairs))


def webhook_problems(data: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    """What the schema cannot say: a secret in the right form, each URL once."""
    seen: dict[str, int] = {}
    for index, item in enumerate(data.get("webhooks") or []):
        where = f"$.webhooks[{index}]"
        listed = isinstance(item["secret"], list)
        for number, secret in enumerate(_listed(item["secret"])):
            try:
                decode_secret(secret)
            except ValueError as exc:
                yield f"{where}.secret" + (f"[{number}]" if listed else ""), str(exc)
        if item["url"] in seen:
            yield f"{where}.url", f"the same URL as webhooks[{seen[item['url']]}]: list its events once"
        seen.setdefault(item["url"], index)
        if not urlsplit(item["url"]).hostname:
            yield f"{where}.url", f"{shown_url(item['url'])!r} names no host"
        if parse_duration(item["timeout"]) <= 0:
            yield f"{where}.timeout", "must be longer than 0s"
