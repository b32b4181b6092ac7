"""Sending over SMTP with smtplib, phase by phase, so a classifier knows what the server refused."""

from __future__ import annotations

import smtplib
import socket
from collections.abc import Mapping, MutableMapping
from typing import Any

from senddock import mime
from senddock.durations import parse_duration
from senddock.outcome import Message, SendResult

TRANSPORT = "smtp"
_STATE_KEY = "senddock_smtp.connection"


class PhaseError(Exception):
    """A non-2xx reply, with the phase it came in."""

    def __init__(self, phase: str, code: int, text: str) -> None:
        super().__init__(f"{code} {text}")
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


def result_for(phase: str, code: int, text: str, *, may_have_sent: bool = False, ok: bool = False) -> SendResult:
    enhanced, message = _split_enhanced(text.strip())
    return SendResult(TRANSPORT, ok=ok, code=code, enhanced_code=enhanced, text=message, phase=phase,
                      may_have_sent=may_have_sent)


def _open(settings: Mapping[str, Any]) -> smtplib.SMTP:
    timeout = parse_duration(settings["timeout"])
    phase = "connect"
    try:
        conn = smtplib.SMTP(settings["host"], settings["port"], local_hostname=settings["helo_name"], timeout=timeout)
    except smtplib.SMTPConnectError as exc:
        raise PhaseError(phase, exc.smtp_code, _text(exc.smtp_error)) from exc
    try:
        code, reply = conn.ehlo()
        if not 200 <= code < 300:
            code, reply = conn.helo()
            if not 200 <= code < 300:
                raise PhaseError("ehlo", code, _text(reply))
        if settings.get("username"):
            try:
                conn.login(settings["username"], settings.get("password") or "")
            except smtplib.SMTPAuthenticationError as exc:
                raise PhaseError("auth", exc.smtp_code, _text(exc.smtp_error)) from exc
            except smtplib.SMTPNotSupportedError as exc:
                raise PhaseError("auth", 502, f"the server offers no AUTH: {exc}") from exc
    except BaseException:
        conn.close()
        raise
    return conn


def send(message: Message, settings: Mapping[str, Any], worker_state: MutableMapping[str, Any]) -> SendResult:
    conn: smtplib.SMTP | None = worker_state.get(_STATE_KEY)
    email = mime.build_email(message, message_id_domain=settings.get("message_id_domain"))
    envelope = (mime.envelope_sender(message), message.recipient.email, email.as_bytes())
    try:
        if conn is not None:
            try:
                result = _transaction(conn, *envelope)
                if not (result.phase == "mail" and result.code == 421):
                    return result
            except (OSError, smtplib.SMTPServerDisconnected) as exc:
                if getattr(exc, "senddock_phase", None) != "mail":
                    raise
            # The server closed (or is closing, 421) the idle connection we kept: nothing was
            # sent, so open a new one rather than count a failure against this recipient.
            close(worker_state, graceful=False)
        conn = worker_state[_STATE_KEY] = _open(settings)
        return _transaction(conn, *envelope)
    except PhaseError as exc:
        close(worker_state, graceful=False)
        return result_for(exc.phase, exc.code, exc.text)
    except (OSError, smtplib.SMTPException) as exc:
        # Connection refused or reset, DNS, timeouts, a server that hung up: the connection is gone.
        close(worker_state, graceful=False)
        phase = getattr(exc, "senddock_phase", "connect" if conn is None else "session")
        may_have_sent = getattr(exc, "senddock_may_have_sent", False)
        return SendResult(TRANSPORT, ok=False, text=f"{type(exc).__name__}: {exc}".rstrip(": "), phase=phase,
                          error=exc, may_have_sent=may_have_sent)
    except BaseException:
        # Anything else (an address smtplib cannot encode...) may leave a transaction half open:
        # the next recipient must not inherit it.
        close(worker_state, graceful=False)
        raise


def _transaction(conn: smtplib.SMTP, sender: str, recipient: str, data: bytes) -> SendResult:
    code, reply = _step(conn.mail, "mail", sender)
    if code >= 400:
        _reset(conn)
        return result_for("mail", code, _text(reply))
    code, reply = _step(conn.rcpt, "rcpt", recipient)
    if code >= 400:
        _reset(conn)
        return result_for("rcpt", code, _text(reply))
    try:
        code, reply = conn.data(data)
    except smtplib.SMTPDataError as exc:  # refused before the message was transferred
        _reset(conn)
        return result_for("data", exc.smtp_code, _text(exc.smtp_error))
    except (OSError, smtplib.SMTPServerDisconnected) as exc:
        # The server may have accepted the message before the connection broke: in doubt.
        exc.senddock_phase = "data"  # type: ignore[attr-defined]
        exc.senddock_may_have_sent = True  # type: ignore[attr-defined]
        raise
    if code >= 400:
        _reset(conn)
        return result_for("data", code, _text(reply))
    return result_for("data", code, _text(reply), ok=True)


def _step(command, phase: str, argument: str) -> tuple[int, bytes]:
    try:
        return command(argument)
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
    conn: smtplib.SMTP | None = worker_state.pop(_STATE_KEY, None)
    if conn is None:
        return
    if graceful:
        try:
            conn.quit()
            return
        except (OSError, smtplib.SMTPException, socket.error):
            pass
    conn.close()
