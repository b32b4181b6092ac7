"""The ``bounces`` section, typed: the keys that sign VERP tokens, what a soft bounce costs, and the
two intakes as written (``receive``, the SMTP server; ``mailbox``, the IMAP/POP3 fetch).

The intakes check what only they can (a listen port in range, a mailbox URL they can reach) when
they start: see senddock.bounces.receiver and senddock.bounces.mailbox.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from senddock.durations import parse_duration
from senddock.sizes import parse_size


@dataclass(frozen=True)
class SoftBounceSettings:
    limit: int  # soft bounces within window, no delivery between, that suppress an address
    window: float


@dataclass(frozen=True)
class BounceReceiveSettings:
    listen: str  # host:port as written
    addresses: tuple[str, ...] | None  # glob patterns; None: smtp.return_path with {token} as *
    max_connections: int
    max_sessions_per_client: int
    session_lifetime: float
    max_recipients: int
    in_serve: bool


@dataclass(frozen=True)
class BounceMailboxSettings:
    url: str | None  # imap://USER@HOST/FOLDER or pop3://USER@HOST, no password in it
    password: str | None = field(repr=False)
    security: str  # tls | starttls | none
    verify: bool
    ca_file: str | None  # as written: relative to the config's folder
    after: str  # delete | move:FOLDER
    unreadable: str
    interval: float
    timeout: float


@dataclass(frozen=True)
class BouncesSettings:
    # The first key signs; every one verifies (rotation: the new key first, the old after it).
    secrets: tuple[str, ...] = field(repr=False)
    soft: SoftBounceSettings
    max_message_size: int  # bytes
    receive: BounceReceiveSettings
    mailbox: BounceMailboxSettings


def bounces_settings(section: Mapping[str, Any]) -> BouncesSettings:
    secret, soft, receive, mailbox = section["secret"], section["soft"], section["receive"], section["mailbox"]
    return BouncesSettings(
        # One key written alone or a list of them: a tuple either way, empty when none is set.
        secrets=(secret,) if isinstance(secret, str) else tuple(secret or ()),
        soft=SoftBounceSettings(limit=soft["limit"], window=parse_duration(soft["window"])),
        max_message_size=parse_size(section["max_message_size"]),
        receive=BounceReceiveSettings(
            listen=receive["listen"],
            addresses=None if receive["addresses"] is None else tuple(receive["addresses"]),
            max_connections=receive["max_connections"], max_sessions_per_client=receive["max_sessions_per_client"],
            session_lifetime=parse_duration(receive["session_lifetime"]), max_recipients=receive["max_recipients"],
            in_serve=receive["in_serve"]),
        mailbox=BounceMailboxSettings(
            url=mailbox["url"], password=mailbox["password"], security=mailbox["security"], verify=mailbox["verify"],
            ca_file=mailbox["ca_file"], after=mailbox["after"], unreadable=mailbox["unreadable"],
            interval=parse_duration(mailbox["interval"]), timeout=parse_duration(mailbox["timeout"])),
    )
