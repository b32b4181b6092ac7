"""`senddock bounces receive`: an inbound SMTP server for what comes back to the return path.

Put it behind the domain's MX or a relay's transport map (docs/bounces.md). It is no open relay:
RCPT is accepted only for the addresses ``bounces.receive.addresses`` allows (the return-path
pattern), anything else gets ``550 5.1.1``. Each message is applied before the final reply, so
``250`` means committed: a crash before it makes the sending server try again later, and a message
that arrives twice is recorded once (its key, see senddock.bounces.parsing). A database that is
down answers ``451``: the sender keeps the message and retries. A message that cannot be applied
is recorded as ``unreadable`` and answered ``250`` (``554`` if even that failed): never a ``4xx``
that would come back for days.
"""

from __future__ import annotations

import asyncio
import fnmatch
import glob
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import structlog
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, Envelope, Session

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
    # What one client may hold, so that it can never take every session from the others.
    max_sessions_per_client: int = 3
    session_lifetime: float = 600.0
    max_recipients: int = 100


def receive_settings(config: Config) -> ReceiveSettings:
    """The ``bounces.receive`` section, typed; UsageError naming the key when it cannot serve."""
    bounces = config.bounces
    receive = bounces.receive
    host, _, port = receive.listen.rpartition(":")
    if not 0 < int(port) < 65536:
        raise UsageError(f"bounces.receive.listen: port {port} is not between 1 and 65535")
    addresses = receive.addresses
    if not addresses:
        template = (config.section("smtp") or {}).get("return_path") or ""
        if "{token}" not in template:
            raise UsageError("bounces.receive.addresses: say which recipients to accept (e.g. "
                             "[\"bounces+*@example.com\"]); smtp.return_path has no {token} to derive them from")
        # Escaped first: an address literal's brackets are no character class.
        addresses = [glob.escape(template).replace("{token}", "*")]
    return ReceiveSettings(host.strip("[]"), int(port), tuple(addresses),
                           bounces.max_message_size,
                           receive.max_connections,
                           max_sessions_per_client=receive.max_sessions_per_client,
                           session_lifetime=receive.session_lifetime,
                           max_recipients=receive.max_recipients)


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
        given = getattr(session, "senddock_recipients", 0)
        if given >= self._settings.max_recipients:
            return "452 4.5.3 Too many recipients in this session"  # RFC 5321 4.5.3.1.10
        session.senddock_recipients = given + 1
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
        except Exception as exc:  # noqa: BLE001 - said to the sender, in one of two ways
            log.error("bounce_receive_failed", origin=origin, error=f"{type(exc).__name__}: {exc}"[:300])
            if _unreachable(exc):
                return "451 4.3.0 Not recorded, try again later"  # the sender keeps it and tries again
            # Whatever else failed would fail again: a 4xx would have the sender retry it for days.
            return "554 5.6.0 Not recorded: the message cannot be applied"
        if getattr(outcome, "hooks_failed", False):
            # Recorded, but on_bounced failed: only the message arriving again re-runs it.
            return "451 4.3.0 Not applied yet, try again later"
        return f"250 2.0.0 Recorded: {getattr(outcome, 'outcome', 'ok')}"


def _unreachable(exc: BaseException) -> bool:
    """The database (or the network to it) is away for now: the message is worth sending again."""
    import psycopg

    from senddock.errors import DatabaseError

    return isinstance(exc, (psycopg.OperationalError, DatabaseError, OSError))


class _LimitedSMTP(SMTP):
    """aiosmtpd's session, refused with 421 beyond ``max_connections`` at once or beyond
    ``per_client`` from one address, and ended with 421 after ``lifetime`` seconds."""

    active = 0
    by_client: Counter[str]
    lock = threading.Lock()
    limit = 0
    per_client = 3
    lifetime = 600.0

    def connection_made(self, transport) -> None:  # type: ignore[override]
        cls = type(self)
        peer = transport.get_extra_info("peername")
        client = peer[0] if isinstance(peer, tuple) and peer else "?"
        with cls.lock:
            refusal = (b"421 4.3.2 Too many connections, try again later" if cls.active >= cls.limit else
                       b"421 4.7.0 Too many connections from your address, try again later"
                       if cls.by_client[client] >= cls.per_client else None)
            if refusal is None:
                cls.active += 1
                cls.by_client[client] += 1
        if refusal is not None:
            transport.write(refusal + b"\r\n")
            transport.close()
            self._counted = None
            return
        self._counted = client
        # However it keeps busy (NOOP every minute), a session ends: its slot is the others' too.
        self._lifetime = asyncio.get_running_loop().call_later(cls.lifetime, self._too_long)
        super().connection_made(transport)

    def _too_long(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(b"421 4.4.2 Session too long, closing\r\n")
            self.transport.close()

    def connection_lost(self, error) -> None:  # type: ignore[override]
        client = getattr(self, "_counted", None)
        if client is not None:
            self._lifetime.cancel()
            cls = type(self)
            with cls.lock:
                cls.active -= 1
                cls.by_client[client] -= 1
                if cls.by_client[client] <= 0:
                    del cls.by_client[client]
            self._counted = None
        if getattr(self, "transport", None) is not None:
            super().connection_lost(error)


class BounceReceiver:
    """The server in a background thread: ``start()``, ``port``, ``stop()``."""

    def __init__(self, settings: ReceiveSettings, apply: Apply) -> None:
        self.settings = settings
        self._executor = ThreadPoolExecutor(max_workers=4, thread_name_prefix="senddock-bounce")
        handler = _Handler(settings, apply, self._executor)
        # A class per server: its count of sessions is its own.
        smtp_class = type("BounceSMTP", (_LimitedSMTP,), {
            "active": 0, "by_client": Counter(), "lock": threading.Lock(), "limit": settings.max_connections,
            "per_client": settings.max_sessions_per_client, "lifetime": settings.session_lifetime})

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
