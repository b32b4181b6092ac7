"""A development SMTP server (aiosmtpd) that accepts mail, prints a line per message, can save .eml
files, and answers chosen addresses with chosen replies. Used by `senddock sink`, the demo and tests."""

from __future__ import annotations

import asyncio
import fnmatch
import functools
import re
import ssl
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from email.message import EmailMessage
from email.parser import BytesHeaderParser
from email.policy import default as default_policy
from pathlib import Path

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, AuthResult, Envelope, LoginPassword, Session

_REPLY = re.compile(r"^[245]\d\d( .*)?$")
_EXAMPLE_REPLY = "550 5.1.1 no such user"
_EXAMPLE_RULE = f"bounce*@*={_EXAMPLE_REPLY}"


def _reply_problem(reply: str) -> str | None:
    """What keeps ``reply`` from being an SMTP reply line, in words; None when it is one."""
    if _REPLY.match(reply):
        return None
    if not reply:
        return f"the REPLY after '=' is empty: start with a 3-digit code, e.g. {_EXAMPLE_REPLY}"
    code = re.match(r"\d{3}(?= |$)", reply)
    if code is None:
        return f"{reply!r} is not an SMTP reply: start with a 3-digit code, e.g. {_EXAMPLE_REPLY}"
    return (f"{reply!r} is not an SMTP reply: its code {code.group()} must start with 2 (accept), 4 (try "
            f"later) or 5 (refuse), e.g. {_EXAMPLE_REPLY}")


def _rule_parts(option: str, text: str, left: str, example: str) -> tuple[str, str]:
    """``LEFT=REPLY`` split; ValueError when there is no '='."""
    before, sep, reply = text.partition("=")
    if not sep:
        raise ValueError(f"{option} {text!r}: expected {left}=REPLY, e.g. '{example}'")
    return before, reply.strip()


def _check_reply(option: str, text: str, reply: str) -> None:
    problem = _reply_problem(reply)
    if problem:
        raise ValueError(f"{option} {text!r}: {problem}")


@dataclass(frozen=True)
class FailRule:
    """``PATTERN=REPLY``: recipients matching PATTERN get REPLY at RCPT TO. ``mail:PATTERN`` matches
    the envelope sender at MAIL FROM, ``data:PATTERN`` a recipient at the end of DATA.
    ``PATTERN xN=REPLY``: only the first N times each address is seen; then it is accepted (a
    mailbox busy for a while: ``'later*@* x2=450 4.2.0 mailbox busy'`` defers twice, then delivers)."""

    phase: str
    pattern: str
    reply: str
    times: int | None = None  # None: every time

    @classmethod
    def parse(cls, text: str) -> FailRule:
        """ValueError saying which part is wrong: the form, the pattern or the reply."""
        pattern, reply = _rule_parts("--fail", text, "PATTERN", _EXAMPLE_RULE)
        pattern, times = _times(text, pattern)
        if not pattern.strip():
            raise ValueError(f"--fail {text!r}: the PATTERN before '=' is empty: name the recipients it is for, "
                             f"e.g. '{_EXAMPLE_RULE}' ('*' for everyone)")
        _check_reply("--fail", text, reply)
        phase, colon, rest = pattern.partition(":")
        if colon and phase in ("mail", "rcpt", "data"):
            return cls(phase, rest.strip().lower(), reply, times)
        return cls("rcpt", pattern.strip().lower(), reply, times)

    def matches(self, phase: str, address: str) -> bool:
        return phase == self.phase and fnmatch.fnmatchcase(address.lower(), self.pattern)


def _times(text: str, pattern: str) -> tuple[str, int | None]:
    """``'later*@* x2'`` -> ``('later*@*', 2)``: a count after a space (no address has one)."""
    before, space, last = pattern.rstrip().rpartition(" ")
    if not space or not last.lower().startswith("x"):
        return pattern, None
    count = last[1:]
    if not count.isdigit() or int(count) < 1:
        raise ValueError(f"--fail {text!r}: {last!r} is not a count: write xN with N at least 1, "
                         f"e.g. 'later*@* x2=450 4.2.0 mailbox busy'")
    return before, int(count)


@dataclass
class RateRule:
    """``RATE=REPLY``: recipients beyond RATE (``5/s``, ``300/min``) get REPLY at RCPT TO, as a
    provider that throttles a sender answers (``421 4.7.28 ...``). A bucket of one second's worth
    (at least 1), refilled at the rate: an idle sink takes that many at once."""

    per_second: float
    reply: str
    _tokens: float = 0.0
    _at: float = 0.0

    def __post_init__(self) -> None:
        self._tokens, self._at = self.capacity, time.monotonic()

    @property
    def capacity(self) -> float:
        return max(1.0, self.per_second)

    @classmethod
    def parse(cls, text: str) -> RateRule:
        """ValueError saying which part is wrong."""
        from senddock.pacing.rates import parse_rate

        rate, reply = _rule_parts("--limit", text, "RATE", "5/s=421 4.7.28 rate limited")
        try:
            per_second = parse_rate(rate.strip()).per_second
        except ValueError as exc:
            raise ValueError(f"--limit {text!r}: {exc}") from None
        _check_reply("--limit", text, reply)
        return cls(per_second, reply)

    def refuses(self) -> bool:
        """Whether one more recipient now is over the rate (taking its token if not)."""
        now = time.monotonic()
        self._tokens = min(self.capacity, self._tokens + (now - self._at) * self.per_second)
        self._at = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return False
        return True


@dataclass(frozen=True)
class Received:
    sender: str
    recipients: tuple[str, ...]
    data: bytes
    peer: tuple = ()  # the client's (host, port): one per SMTP connection
    at: float = 0.0  # time.time() when accepted (after any delay): what a relay's rate is measured by

    # Read from the headers when first asked: parsing every message as it arrived (0.95 ms, the
    # body too) was the sink's largest cost in a drain through it, and most callers never ask.
    @functools.cached_property
    def _headers(self) -> EmailMessage:
        return BytesHeaderParser(policy=default_policy).parsebytes(self.data)

    @property
    def message_id(self) -> str:
        return str(self._headers.get("Message-ID", ""))

    @property
    def subject(self) -> str:
        return str(self._headers.get("Subject", ""))


@dataclass
class SinkHandler:
    rules: Sequence[FailRule] = ()
    limit: RateRule | None = None  # recipients over its rate get its reply
    limited: list[float] = field(default_factory=list)  # time.time() of each recipient the limit refused
    delay: float = 0.0  # seconds before answering the final "." (a relay's own latency)
    save_dir: Path | None = None
    on_message: Callable[[Received], None] | None = None
    received: list[Received] = field(default_factory=list)
    greeted: set[tuple] = field(default_factory=set)  # the peer (host, port) of each session that said EHLO
    # Offer RFC 2920 PIPELINING, as Postfix, Exim and the big providers do (aiosmtpd reads commands
    # in order whether or not they came in one write; it just does not say so).
    pipelining: bool = True
    _lock: threading.Lock = field(default_factory=threading.Lock)
    answered: dict[tuple, int] = field(default_factory=dict)  # (rule, address): times a counted rule answered

    def _rule(self, phase: str, address: str) -> str | None:
        for rule in self.rules:
            if not rule.matches(phase, address):
                continue
            if rule.times is None:
                return rule.reply
            with self._lock:  # the sink's connections are served from one loop, its tests read from others
                key = (rule, address.lower())
                self.answered[key] = seen = self.answered.get(key, 0) + 1
            if seen <= rule.times:
                return rule.reply
        return None

    async def handle_EHLO(self, server: SMTP, session: Session, envelope: Envelope, hostname: str,
                          responses: list[str]) -> list[str]:
        session.host_name = hostname
        with self._lock:
            self.greeted.add(tuple(session.peer or ()))
        if self.pipelining:
            return [*responses[:-1], "250-PIPELINING", responses[-1]]
        return responses

    def sessions(self) -> set[tuple]:
        """The client ends (host, port) of the sessions that said EHLO: one per SMTP connection."""
        with self._lock:
            return set(self.greeted)  # a copy: the sink goes on adding

    async def handle_MAIL(self, server: SMTP, session: Session, envelope: Envelope, address: str, options) -> str:
        reply = self._rule("mail", address)
        if reply:
            return reply
        envelope.mail_from = address
        envelope.mail_options.extend(options)
        return "250 OK"

    async def handle_RCPT(self, server: SMTP, session: Session, envelope: Envelope, address: str, options) -> str:
        reply = self._rule("rcpt", address)
        if reply:
            return reply
        limit = self.limit
        if limit is not None:
            with self._lock:
                refused = limit.refuses()
                if refused:
                    self.limited.append(time.time())
            if refused:
                return limit.reply
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        for address in envelope.rcpt_tos:
            reply = self._rule("data", address)
            if reply:
                return reply
        if self.delay:
            await asyncio.sleep(self.delay)
        data = envelope.original_content or envelope.content
        if isinstance(data, str):
            data = data.encode("utf-8")
        received = Received(
            sender=envelope.mail_from or "",
            recipients=tuple(envelope.rcpt_tos),
            data=data,
            peer=tuple(session.peer or ()),
            at=time.time(),
        )
        with self._lock:
            self.received.append(received)
            index = len(self.received)
        if self.save_dir is not None:
            (self.save_dir / f"{index:06d}.eml").write_bytes(data)
        if self.on_message is not None:
            self.on_message(received)
        return "250 2.0.0 Message accepted for delivery"

    def snapshot(self) -> list[Received]:
        with self._lock:
            return list(self.received)


class Sink:
    """An SMTP server in a background thread: ``with Sink(port=0) as sink: ... sink.port``."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 1025,
        *,
        rules: Sequence[FailRule] = (),
        limit: RateRule | None = None,
        delay: float = 0.0,
        save_dir: Path | None = None,
        on_message: Callable[[Received], None] | None = None,
        credentials: tuple[str, str] | None = None,
        security: str = "none",
        tls_context: ssl.SSLContext | None = None,
    ) -> None:
        """``security``: ``none``, ``starttls`` (offered and required before MAIL) or ``tls``
        (implicit TLS from the first byte); both need a server-side ``tls_context``. ``delay``:
        seconds each message waits before its final reply, as a real relay's latency."""
        self.handler = SinkHandler(rules=rules, limit=limit, delay=delay, save_dir=save_dir, on_message=on_message)
        self.host = host
        self._port = port
        kwargs: dict = {}
        if security != "none" and tls_context is None:
            raise ValueError(f"security={security!r} needs a tls_context")
        if security == "starttls":
            kwargs.update(tls_context=tls_context, require_starttls=True)
        elif security == "tls":
            kwargs.update(ssl_context=tls_context)
        if credentials is not None:
            expected = (credentials[0].encode(), credentials[1].encode())

            def authenticate(server, session, envelope, mechanism, auth_data) -> AuthResult:
                ok = isinstance(auth_data, LoginPassword) and (auth_data.login, auth_data.password) == expected
                return AuthResult(success=ok, handled=False)

            # Over plain SMTP the sink accepts AUTH in clear text (development only); with TLS it
            # insists on it, as real relays do.
            kwargs.update(authenticator=authenticate, auth_require_tls=security != "none", auth_required=True)
        if save_dir is not None:
            save_dir.mkdir(parents=True, exist_ok=True)
        self._controller = Controller(self.handler, hostname=host, port=port or free_port(host), **kwargs)

    @property
    def port(self) -> int:
        return self._controller.port

    @property
    def received(self) -> list[Received]:
        return self.handler.snapshot()

    def start(self) -> Sink:
        self._controller.start()
        return self

    def stop(self) -> None:
        self._controller.stop()

    def __enter__(self) -> Sink:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def free_port(host: str) -> int:
    import socket

    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]
