"""`senddock bounces receive`: an inbound SMTP server for what comes back to the return path.

Put it behind the domain's MX or a relay's transport map (docs/bounces.md). It is no open relay:
RCPT is accepted only for the addresses ``bounces.receive.addresses`` allows (the return-path
pattern), anything else gets ``550 5.1.1``. Each message is applied before the final reply, so
``250`` means committed: a crash before it makes the sending server try again later, and a message
that arrives twice is recorded once (its key, see senddock.bounces.parsing). A database that is
down answers ``451``: the sender keeps the message and retries.
"""

from __future__ import annotations

import asyncio
import fnmatch
import glob
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import structlog
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, Envelope, Session

from senddock.bounces.parsing import max_message_size
from senddock.config import Config
from senddock.errors import UsageError
from senddock.sink import free_port

log = structlog.get_logger(__name__)

IDLE_TIMEOUT = 60  # seconds a session may sit idle (aiosmtpd's default, 300, lets a few clients hold every slot)

Apply = Callable[[bytes, str, Sequence[str]], object]  # (raw, origin, RCPT TO addresses) -> outcome


@dataclass(frozen=True)
class ReceiveSettings:
    host: str
    port: int
    addresses: tuple[str, ...]  # glob patterns, case-insensitive: bounces+*@example.com
    max_message_size: int
    max_connections: int


def receive_settings(config: Config) -> ReceiveSettings:
    """The ``bounces.receive`` section, typed; UsageError naming the key when it cannot serve."""
    section = config.section("bounces")
    receive = section.get("receive") or {}
    host, _, port = receive.get("listen", "127.0.0.1:2526").rpartition(":")
    if not 0 < int(port) < 65536:
        raise UsageError(f"bounces.receive.listen: port {port} is not between 1 and 65535")
    addresses = receive.get("addresses")
    if not addresses:
        template = (config.section("smtp") or {}).get("return_path") or ""
        if "{token}" not in template:
            raise UsageError("bounces.receive.addresses: say which recipients to accept (e.g. "
                             "[\"bounces+*@example.com\"]); smtp.return_path has no {token} to derive them from")
        # Escaped first: an address literal's brackets are no character class.
        addresses = [glob.escape(template).replace("{token}", "*")]
    return ReceiveSettings(host.strip("[]"), int(port), tuple(addresses),
                           max_message_size(config),
                           receive.get("max_connections", 20))


def start_receiver(config: Config, apply_mail: Callable[..., Any]) -> BounceReceiver:
    """The receiver on ``bounces.receive``, applying each message with ``apply_mail`` (the API's);
    UsageError naming the key when it cannot listen. For `bounces receive` and `serve` alike."""
    settings = receive_settings(config)

    def apply(raw: bytes, origin: str | None, recipients: Sequence[str]) -> object:
        return apply_mail(raw, via="receive", origin=origin, envelope_recipients=recipients)

    try:
        return BounceReceiver(settings, apply).start()
    except OSError as exc:
        raise UsageError(f"bounces.receive.listen: cannot listen on {settings.host}:{settings.port}: "
                         f"{exc.strerror or exc}") from None


def accepts(patterns: Sequence[str], address: str) -> bool:
    address = address.strip().strip("<>").lower()
    return any(fnmatch.fnmatchcase(address, p.lower()) for p in patterns)


class _Handler:
    def __init__(self, settings: ReceiveSettings, apply: Apply, executor: ThreadPoolExecutor) -> None:
        self._settings = settings
        self._apply = apply
        self._executor = executor

    async def handle_RCPT(self, server: SMTP, session: Session, envelope: Envelope, address: str, options) -> str:
        if not accepts(self._settings.addresses, address):
            return "550 5.1.1 No such recipient here"  # never an open relay
        envelope.rcpt_tos.append(address)
        return "250 2.1.5 OK"

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        raw = envelope.original_content or envelope.content or b""
        if isinstance(raw, str):
            raw = raw.encode("utf-8", "surrogateescape")
        origin = f"{session.peer[0]}:{session.peer[1]}" if session.peer else None
        loop = asyncio.get_running_loop()
        try:
            # The database work runs in a thread; the reply waits for its commit.
            outcome = await loop.run_in_executor(self._executor, self._apply, raw, origin, tuple(envelope.rcpt_tos))
        except Exception as exc:  # noqa: BLE001 - the sender keeps the message and tries again
            log.error("bounce_receive_failed", origin=origin, error=f"{type(exc).__name__}: {exc}"[:300])
            return "451 4.3.0 Not recorded, try again later"
        if getattr(outcome, "hooks_failed", False):
            # Recorded, but on_bounced failed: only the message arriving again re-runs it.
            return "451 4.3.0 Not applied yet, try again later"
        return f"250 2.0.0 Recorded: {getattr(outcome, 'outcome', 'ok')}"


class _LimitedSMTP(SMTP):
    """aiosmtpd's session, refused with 421 beyond ``max_connections`` at once."""

    active = 0
    lock = threading.Lock()
    limit = 0

    def connection_made(self, transport) -> None:  # type: ignore[override]
        cls = type(self)
        with cls.lock:
            full = cls.active >= cls.limit
            if not full:
                cls.active += 1
        if full:
            transport.write(b"421 4.3.2 Too many connections, try again later\r\n")
            transport.close()
            self._counted = False
            return
        self._counted = True
        super().connection_made(transport)

    def connection_lost(self, error) -> None:  # type: ignore[override]
        if getattr(self, "_counted", False):
            with type(self).lock:
                type(self).active -= 1
            self._counted = False
        if getattr(self, "transport", None) is not None:
            super().connection_lost(error)


class BounceReceiver:
    """The server in a background thread: ``start()``, ``port``, ``stop()``."""

    def __init__(self, settings: ReceiveSettings, apply: Apply) -> None:
        self.settings = settings
        self._executor = ThreadPoolExecutor(max_workers=4, thread_name_prefix="senddock-bounce")
        handler = _Handler(settings, apply, self._executor)
        # A class per server: its count of sessions is its own.
        smtp_class = type("BounceSMTP", (_LimitedSMTP,), {"active": 0, "lock": threading.Lock(),
                                                           "limit": settings.max_connections})

        class _Controller(Controller):
            def factory(self):  # noqa: D401 - aiosmtpd's hook
                return smtp_class(self.handler, **self.SMTP_kwargs)

        self._controller = _Controller(
            handler, hostname=settings.host, port=settings.port or free_port(settings.host), data_size_limit=settings.max_message_size,
            enable_SMTPUTF8=True, ident="senddock bounces", server_hostname=None,
            timeout=IDLE_TIMEOUT)

    @property
    def port(self) -> int:
        return self._controller.port

    def start(self) -> BounceReceiver:
        self._controller.start()
        return self

    on_stop: Callable[[], None] | None = None  # e.g. close the database the receiver applies to

    def stop(self) -> None:
        self._controller.stop()
        self._executor.shutdown(wait=True)
        if self.on_stop is not None:
            self.on_stop()
