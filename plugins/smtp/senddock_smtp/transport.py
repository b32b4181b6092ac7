"""Sending over SMTP with smtplib, phase by phase, so a classifier knows what the server refused.

One connection per sender thread, kept in ``worker_state`` and reused for many messages: opened at
the thread's first send (or as it starts, with ``connect_at_start``), re-opened after
``max_messages_per_connection``, after a 421, after any connection error and after ``IDLE_REOPEN``
seconds idle; RSET after a failed transaction. ``timeout`` bounds the connect and every command
(smtplib sets it on the socket).
"""

from __future__ import annotations

import re
import smtplib
import socket
import ssl
import time
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from senddock.durations import parse_duration
from senddock.mail import mime
from senddock.outcome import Message, SendResult

TRANSPORT = "smtp"
_STATE_KEY = "senddock_smtp.connection"
# A connection idle this long is closed and a fresh one opened: relays drop idle sessions (often
# after a minute or five), and one dropped silently (a NAT, a firewall) would hold the next send
# for a whole ``timeout`` before it reconnects.
IDLE_REOPEN = 60.0
# An addr-spec as senddock stores it (checked at import): written as it is in MAIL and RCPT.
_PLAIN_ADDRESS = re.compile(r"[^\s<>()\[\],;:\\\"]*@[^\s<>()\[\],;:\\\"]+|")
_LEADING_DOT = re.compile(rb"(?m)^\.")  # smtplib's dot-stuffing (RFC 5321 4.5.2)


@dataclass
class _Connection:
    smtp: smtplib.SMTP
    messages: int = 0
    used_at: float = field(default_factory=time.monotonic)  # opened, or its last transaction began


class PhaseError(Exception):
    """A non-2xx reply (or a failed TLS set-up), with the phase it came in."""

    def __init__(self, phase: str, code: int | None, text: str) -> None:
        super().__init__(f"{code} {text}" if code else text)
        self.phase, self.code, self.text = phase, code, text


def _text(reply: bytes | str) -> str:
    return reply.decode("utf-8", "replace") if isinstance(reply, bytes) else str(reply)


def _split_enhanced(text: str) -> tuple[str | None, str]:
    """``5.1.1 no such user`` -> ("5.1.1", "no such user")."""
    first, _, rest = text.partition(" ")
    parts = first.split(".")
    if len(parts) == 3 and all(p.isdigit() for p in parts) and parts[0] in ("2", "4", "5"):
        return first, rest
    return None, text


def result_for(phase: str, code: int | None, text: str, *, may_have_sent: bool = False, ok: bool = False) -> SendResult:
    enhanced, message = _split_enhanced(text.strip())
    return SendResult(TRANSPORT, ok=ok, code=code, enhanced_code=enhanced, text=message, phase=phase,
                      may_have_sent=may_have_sent)


def tls_context(settings: Mapping[str, Any]) -> ssl.SSLContext:
    """Certificates and host names verified unless ``verify: false``; ``ca_file`` for a private CA."""
    context = ssl.create_default_context(cafile=settings.get("ca_file"))
    if not settings.get("verify", True):
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


def _open(settings: Mapping[str, Any]) -> smtplib.SMTP:
    timeout = parse_duration(settings["timeout"])
    security = settings.get("security", "starttls")
    host, port, helo = settings["host"], settings["port"], settings["helo_name"]
    try:
        if security == "tls":
            conn = smtplib.SMTP_SSL(host, port, local_hostname=helo, timeout=timeout, context=tls_context(settings))
        else:
            conn = smtplib.SMTP(host, port, local_hostname=helo, timeout=timeout)
    except smtplib.SMTPConnectError as exc:  # a greeting other than 220
        raise PhaseError("connect", exc.smtp_code, _text(exc.smtp_error)) from exc
    except ssl.SSLError as exc:  # implicit TLS: the handshake or the certificate failed
        raise PhaseError("tls", None, f"{type(exc).__name__}: {exc}") from exc
    try:
        _hello(conn)
        if security == "starttls":
            _starttls(conn, settings)
            # RFC 3207 4.2: both sides forget the clear-text EHLO; say it again inside TLS (login()
            # would, but only with AUTH). Its answer is what counts: PIPELINING, AUTH, SIZE...
            _hello(conn)
        if settings.get("username"):
            _login(conn, settings["username"], settings.get("password") or "")
    except BaseException:
        conn.close()
        raise
    return conn


def _hello(conn: smtplib.SMTP) -> None:
    code, reply = conn.ehlo()
    if not 200 <= code < 300:
        code, reply = conn.helo()
        if not 200 <= code < 300:
            raise PhaseError("ehlo", code, _text(reply))


def _starttls(conn: smtplib.SMTP, settings: Mapping[str, Any]) -> None:
    """STARTTLS is required when configured: never fall back to sending in clear text."""
    if not conn.has_extn("starttls"):
        raise PhaseError("starttls", None, "the server does not offer STARTTLS (smtp.security: starttls)")
    try:
        code, reply = conn.starttls(context=tls_context(settings))
    except smtplib.SMTPResponseException as exc:
        raise PhaseError("starttls", exc.smtp_code, _text(exc.smtp_error)) from exc
    except ssl.SSLError as exc:
        raise PhaseError("starttls", None, f"{type(exc).__name__}: {exc}") from exc
    if code != 220:
        raise PhaseError("starttls", code, _text(reply))


def _login(conn: smtplib.SMTP, username: str, password: str) -> None:
    try:
        conn.login(username, password)
    except smtplib.SMTPAuthenticationError as exc:
        raise PhaseError("auth", exc.smtp_code, _text(exc.smtp_error)) from exc
    except smtplib.SMTPNotSupportedError as exc:
        raise PhaseError("auth", 502, f"the server offers no AUTH: {exc}") from exc
    except smtplib.SMTPException as exc:  # no mechanism in common
        raise PhaseError("auth", 504, str(exc)) from exc


def probe(settings: Mapping[str, Any]) -> SendResult:
    """Open a session as a send would (greeting, EHLO, STARTTLS, AUTH), then QUIT: is the relay back?"""
    try:
        conn = _open(settings)
    except PhaseError as exc:
        return result_for(exc.phase, exc.code, exc.text)
    except (OSError, smtplib.SMTPException) as exc:
        return SendResult(TRANSPORT, ok=False, text=f"{type(exc).__name__}: {exc}".rstrip(": "), phase="connect",
                          error=exc)
    try:
        code, reply = conn.noop()
    except (OSError, smtplib.SMTPException) as exc:
        conn.close()
        return SendResult(TRANSPORT, ok=False, text=f"{type(exc).__name__}: {exc}".rstrip(": "), phase="session",
                          error=exc)
    close({_STATE_KEY: _Connection(conn)})
    return result_for("session", code, _text(reply), ok=200 <= code < 300)


def connect_ahead(settings: Mapping[str, Any], worker_state: MutableMapping[str, Any]) -> None:
    """Open this thread's connection before its first send. A failure keeps nothing: that send
    opens its own and reports what went wrong, as a send's result (a warm-up is no attempt)."""
    if _STATE_KEY in worker_state:
        return
    try:
        worker_state[_STATE_KEY] = _Connection(_open(settings))
    except (PhaseError, OSError, smtplib.SMTPException):
        pass


def envelope_sender(message: Message, settings: Mapping[str, Any]) -> str:
    """The MAIL FROM address: ``return_path`` with the message's signed VERP token, or the From
    address. A message with no token (a preview's, a test send's) goes out from the From address
    when the template wants one: its bounces name no job anyway."""
    template = settings.get("return_path")
    if not template or ("{token}" in template and message.bounce_token is None):
        return mime.envelope_sender(message)
    return mime.ascii_address(template.replace("{token}", message.bounce_token or ""))


def send(message: Message, settings: Mapping[str, Any], worker_state: MutableMapping[str, Any]) -> SendResult:
    held: _Connection | None = worker_state.get(_STATE_KEY)
    if held is not None and held.messages >= settings.get("max_messages_per_connection", 100):
        close(worker_state)  # relays limit messages per session; a fresh one avoids their 421
        held = None
    elif held is not None and time.monotonic() - held.used_at > IDLE_REOPEN:
        close(worker_state, graceful=False)  # a QUIT to a session dropped silently waits a timeout
        held = None
    recipient = mime.ascii_address(message.recipient.email)
    if not recipient.isascii():
        # A non-ASCII local part needs SMTPUTF8 (RFC 6531) end to end; this transport does not
        # speak it. Answered as a server without it would (RFC 6531 section 3.7.4.2).
        return result_for("rcpt", 553, "5.6.7 the recipient's non-ASCII local part needs SMTPUTF8, "
                                       "which senddock's SMTP transport does not support")
    data = mime.message_bytes(message, message_id_domain=settings.get("message_id_domain"))
    envelope = (envelope_sender(message, settings), recipient, data)
    try:
        if held is not None:
            try:
                result = _transaction(held, *envelope)
                if result.code != 421:
                    return result
                if result.phase != "mail":
                    close(worker_state, graceful=False)
                    return result  # 421 mid-transaction: counted, and the next send reconnects
            except (OSError, smtplib.SMTPServerDisconnected) as exc:
                if getattr(exc, "senddock_phase", None) != "mail":
                    raise
            # The server closed (or is closing, 421) the idle connection we kept: nothing was
            # sent, so open a new one rather than count a failure against this recipient.
            close(worker_state, graceful=False)
        held = worker_state[_STATE_KEY] = _Connection(_open(settings))
        result = _transaction(held, *envelope)
        if result.code == 421:
            close(worker_state, graceful=False)
        return result
    except PhaseError as exc:
        close(worker_state, graceful=False)
        return result_for(exc.phase, exc.code, exc.text)
    except (OSError, smtplib.SMTPException) as exc:
        # Connection refused or reset, DNS, timeouts, a server that hung up: the connection is gone.
        close(worker_state, graceful=False)
        phase = getattr(exc, "senddock_phase", "connect" if held is None else "session")
        may_have_sent = getattr(exc, "senddock_may_have_sent", False)
        return SendResult(TRANSPORT, ok=False, text=f"{type(exc).__name__}: {exc}".rstrip(": "), phase=phase,
                          error=exc, may_have_sent=may_have_sent)
    except BaseException:
        # Anything else (an address smtplib cannot encode...) may leave a transaction half open:
        # the next recipient must not inherit it.
        close(worker_state, graceful=False)
        raise


def _transaction(held: _Connection, sender: str, recipient: str, data: bytes) -> SendResult:
    conn = held.smtp
    held.messages += 1
    held.used_at = time.monotonic()
    if conn.has_extn("pipelining"):
        return _pipelined(conn, sender, recipient, data)
    code, reply = _step(conn.docmd, "mail", f"FROM:{_envelope_address(sender)}")
    if code >= 400:
        _reset(conn)
        return result_for("mail", code, _text(reply))
    code, reply = _step(conn.docmd, "rcpt", f"TO:{_envelope_address(recipient)}")
    if code >= 400:
        _reset(conn)
        return result_for("rcpt", code, _text(reply))
    try:
        return _deliver(conn, lambda: conn.data(data))  # DATA, then the message after its 354
    except smtplib.SMTPDataError as exc:  # refused before the message was transferred
        _reset(conn)
        return result_for("data", exc.smtp_code, _text(exc.smtp_error))


def _deliver(conn: smtplib.SMTP, transfer: Callable[[], tuple[int, bytes]]) -> SendResult:
    """The message's transfer (``transfer`` writes it and reads the final reply)."""
    try:
        code, reply = transfer()
    except (OSError, smtplib.SMTPServerDisconnected) as exc:
        # The server may have accepted the message before the connection broke: in doubt.
        exc.senddock_phase = "data"  # type: ignore[attr-defined]
        exc.senddock_may_have_sent = True  # type: ignore[attr-defined]
        raise
    if code >= 400:
        _reset(conn)
        return result_for("data", code, _text(reply))
    return result_for("data", code, _text(reply), ok=True)


def _pipelined(conn: smtplib.SMTP, sender: str, recipient: str, data: bytes) -> SendResult:
    """RFC 2920 PIPELINING, with a relay that offers it: MAIL, RCPT and DATA go in one write and
    their replies are read in order, two round trips a message instead of four (a relay 50 ms
    away: 100 ms instead of 200). The message itself goes only after DATA's 354; a refusal of
    MAIL or RCPT reads the replies still due, then RSET, as the step by step path does."""
    try:
        conn.send(f"mail FROM:{_envelope_address(sender)}\r\nrcpt TO:{_envelope_address(recipient)}\r\ndata\r\n")
    except (OSError, smtplib.SMTPServerDisconnected) as exc:
        exc.senddock_phase = "mail"  # type: ignore[attr-defined]
        raise
    code, reply = _step(conn.getreply, "mail")
    if code >= 400:
        _abandon(conn, 2)
        return result_for("mail", code, _text(reply))
    code, reply = _step(conn.getreply, "rcpt")
    if code >= 400:
        _abandon(conn, 1)
        return result_for("rcpt", code, _text(reply))
    code, reply = _step(conn.getreply, "data")
    if code != 354:  # refused before the message was transferred (smtplib's SMTPDataError)
        _reset(conn)
        return result_for("data", code, _text(reply))

    def transfer() -> tuple[int, bytes]:
        conn.send(_data_lines(data))
        return conn.getreply()

    return _deliver(conn, transfer)


def _data_lines(data: bytes) -> bytes:
    """The message as smtplib's data() writes it after the 354: leading dots doubled (RFC 5321
    4.5.2), a final CRLF, then the lone dot."""
    stuffed = _LEADING_DOT.sub(b"..", data)
    return stuffed + (b"" if stuffed.endswith(b"\r\n") else b"\r\n") + b".\r\n"


def _abandon(conn: smtplib.SMTP, due: int) -> None:
    """A pipelined transaction refused at MAIL or RCPT: read the ``due`` replies still coming (DATA's
    is a 503 or 554 then; a relay that says 354 all the same gets the lone dot, an empty message to
    no one), then RSET. A relay that hangs up meanwhile (a 421 does) leaves a connection the next
    send finds closed and replaces."""
    try:
        for _ in range(due):
            code, _ = conn.getreply()
        if code == 354:
            conn.send(b".\r\n")
            conn.getreply()
    except (OSError, smtplib.SMTPException):
        return
    _reset(conn)


def _envelope_address(address: str) -> str:
    """``<address>`` for MAIL or RCPT. A plain addr-spec (what senddock stores) is written as it
    is: smtplib's mail() and rcpt() parse every address again with email.utils, a tenth of a
    send's CPU. Anything else (a return_path written with angle brackets or a name, stray spaces)
    is cleaned up as smtplib always did."""
    return f"<{address}>" if _PLAIN_ADDRESS.fullmatch(address) else smtplib.quoteaddr(address)


def _step(call, phase: str, *argument: str) -> tuple[int, bytes]:
    """MAIL or RCPT written with docmd (see _envelope_address), or a pipelined reply read: a broken
    connection says in which phase it broke."""
    try:
        return call(phase, *argument) if argument else call()
    except (OSError, smtplib.SMTPServerDisconnected) as exc:
        exc.senddock_phase = phase  # type: ignore[attr-defined]
        raise


def _reset(conn: smtplib.SMTP) -> None:
    """RSET after a failed transaction, so the connection can carry the next message."""
    try:
        conn.rset()
    except (OSError, smtplib.SMTPException):
        pass


def close(worker_state: MutableMapping[str, Any], *, graceful: bool = True) -> None:
    """QUIT a healthy connection; just drop a broken one (QUIT would wait a whole timeout)."""
    held: _Connection | None = worker_state.pop(_STATE_KEY, None)
    if held is None:
        return
    if graceful:
        try:
            held.smtp.quit()
            return
        except (OSError, smtplib.SMTPException, socket.error):
            pass
    held.smtp.close()
