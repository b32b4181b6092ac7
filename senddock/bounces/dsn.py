"""RFC 3464 delivery status notifications: one report per message, from its recipient blocks.

A DSN is ``multipart/report; report-type=delivery-status`` whose ``message/delivery-status`` part
holds a block of per-message fields, then one block per recipient (Final-Recipient, Action,
Status, Diagnostic-Code...). ``Action: failed`` is a bounce (hard or soft by its status);
``delayed`` is a warning and ``delivered``, ``relayed`` and ``expanded`` are good news: none of
those is a bounce.
"""

from __future__ import annotations

from email.message import EmailMessage, Message

from senddock.bounces.status import failure_kind, status_in
from senddock.outcome import BounceReport, MailReportKind, RecipientStatus

MAX_RECIPIENTS = 1000  # a DSN naming more is read this far (only the job's own address counts anyway)


def parse(message: EmailMessage) -> BounceReport | None:
    """The report of a DSN, or None when ``message`` is not one."""
    part = _status_part(message)
    if part is None:
        return None
    failed: list[tuple[str, MailReportKind, str | None, str | None]] = []
    # The first block is about the message; a malformed DSN may lack it, so recipients are the
    # blocks that name one.
    blocks = [b for b in _blocks(part) if b.get("Final-Recipient") or b.get("Original-Recipient")]
    for block in blocks[:MAX_RECIPIENTS]:
        action = str(block.get("Action", "")).strip().lower()
        recipient = address_of(block.get("Final-Recipient")) or address_of(block.get("Original-Recipient"))
        if action != "failed" or not recipient:
            continue
        diagnostic = _one_line(block.get("Diagnostic-Code"))
        diagnostic = diagnostic.partition(";")[2].strip() if diagnostic and ";" in diagnostic else diagnostic
        status = status_in(str(block.get("Status", ""))) or status_in(diagnostic)
        failed.append((recipient, failure_kind(status, diagnostic), status, diagnostic))
    if not failed:
        actions = sorted({str(b.get("Action", "")).strip().lower() for b in blocks if b.get("Action")})
        reason = f"delivery status notification: {', '.join(actions) or 'no recipient failed'}"
        return BounceReport(MailReportKind.NOT_BOUNCE, reason=reason, parser="dsn")
    kind = MailReportKind.HARD if any(k is MailReportKind.HARD for _, k, _, _ in failed) else MailReportKind.SOFT
    _, _, status, diagnostic = next(f for f in failed if f[1] is kind)
    recipients = tuple(dict.fromkeys(r for r, _, _, _ in failed))
    return BounceReport(kind, recipients, status, diagnostic, parser="dsn",
                        per_recipient=tuple(RecipientStatus(*f) for f in failed))


def _status_part(message: EmailMessage) -> Message | None:
    if message.get_content_type() != "multipart/report":
        return None
    for part in message.walk():
        if part.get_content_type() in ("message/delivery-status", "message/global-delivery-status"):
            return part
    return None


def _blocks(part: Message) -> list[Message]:
    """The header blocks of a delivery-status part (the email package parses them as a list of
    messages; a part it could not split comes as text, parsed here the same way)."""
    payload = part.get_payload()
    if isinstance(payload, list):
        return payload
    from email.parser import HeaderParser

    text = payload if isinstance(payload, str) else ""
    return [HeaderParser().parsestr(block.strip() + "\n") for block in text.replace("\r\n", "\n").split("\n\n")
            if block.strip()]


def address_of(field: object) -> str | None:
    """``rfc822; User@Example.com`` -> ``user@example.com``; None for other address types."""
    if field is None:
        return None
    kind, _, address = str(field).partition(";")
    if not address:
        kind, address = "rfc822", kind
    address = address.strip().strip("<>").strip()
    if kind.strip().lower() not in ("rfc822", "utf-8") or "@" not in address:
        return None
    return address.lower()


def _one_line(field: object) -> str | None:
    return " ".join(str(field).split()) if field is not None else None
