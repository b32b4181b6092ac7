"""RFC 5965 feedback reports (ARF): a recipient marked our message as spam.

``multipart/report; report-type=feedback-report`` with a ``message/feedback-report`` part
(Feedback-Type, Original-Rcpt-To...) and the message complained about, whole or its headers. The
recipient is the report's Original-Rcpt-To, else the returned message's To; providers that
redact both (Microsoft) leave only our token in the returned Message-ID to say whose it was.
"""

from __future__ import annotations

from email.message import EmailMessage, Message
from email.utils import getaddresses

from senddock.bounces.dsn import address_of
from senddock.outcome import BounceReport, MailReportKind

COMPLAINTS = ("abuse", "fraud", "virus")  # not-spam and other are no complaint


def parse(message: EmailMessage) -> BounceReport | None:
    report = _part(message, "message/feedback-report")
    if report is None or message.get_content_type() != "multipart/report":
        return None
    fields = _fields(report)
    feedback_type = str(fields.get("Feedback-Type", "")).strip().lower()
    if feedback_type not in COMPLAINTS:
        return BounceReport(MailReportKind.NOT_BOUNCE, reason=f"feedback report of type {feedback_type or '(none)'}",
                            parser="arf")
    recipients = [a for a in (address_of(v) for v in fields.get_all("Original-Rcpt-To") or ()) if a]
    if not recipients and (returned := returned_headers(message)) is not None:
        recipients = [a.lower() for _, a in getaddresses([str(v) for v in returned.get_all("To") or ()])
                      if "@" in a and not _redacted(a)]
    agent = " ".join(str(fields.get("User-Agent", "")).split())
    return BounceReport(MailReportKind.COMPLAINT, tuple(dict.fromkeys(recipients)), None,
                        f"{feedback_type} report" + (f" from {agent}" if agent else ""), parser="arf")


def returned_headers(message: Message) -> Message | None:
    """The returned message of a report (DSN or ARF), whole or headers only, or None."""
    part = _part(message, "message/rfc822")
    if part is not None:
        payload = part.get_payload()
        return payload[0] if isinstance(payload, list) and payload else None
    part = _part(message, "text/rfc822-headers")
    if part is None:
        return None
    from email.parser import HeaderParser

    return HeaderParser().parsestr(_text(part))


def _part(message: Message, content_type: str) -> Message | None:
    return next((p for p in message.walk() if p.get_content_type() == content_type), None)


def _fields(part: Message) -> Message:
    payload = part.get_payload()
    if isinstance(payload, list) and payload:
        return payload[0]
    from email.parser import HeaderParser

    return HeaderParser().parsestr(_text(part))


def _text(part: Message) -> str:
    data = part.get_payload(decode=True) or b""
    return data.decode("utf-8", "replace") if isinstance(data, bytes) else str(data)


def _redacted(address: str) -> bool:
    local = address.partition("@")[0].lower()
    return "redacted" in local or set(local) <= set("x*.")
