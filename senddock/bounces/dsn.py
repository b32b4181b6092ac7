"""RFC 3464 delivery status notifications: one report per message, from its recipient blocks.

A DSN is ``multipart/report; report-type=delivery-status`` whose ``message/delivery-status`` part
holds a block of per-message fields, then one block per recipient (Final-Recipient, Action,
Status, Diagnostic-Code...). ``Action: failed`` is a bounce (hard or soft by its status);
``delayed`` is a warning and ``delivered``, ``relayed`` and ``expanded`` are good news: none of
those is a bounce.

Real servers bend the format, and a report is read the way they wrote it: the action's first word
(``failed (Bad destination mailbox address)``), ``failure`` for ``failed``, an SMTP reply code where
the status belongs (``Status: 553 Exceeded maximum inbound message size`` is a 5.0.0 with that
text), the address we sent to (``Original-Recipient``) before the one a forward ended at. A report
whose delivery-status part names no recipient at all (Netscape's, MIMEsweeper's) is not read here:
``parse`` says None and the next parser reads the human-readable part.
"""

from __future__ import annotations

import re
from email.message import EmailMessage, Message

from senddock.bounces.status import failure_kind, status_in
from senddock.outcome import BounceReport, MailReportKind, RecipientStatus

MAX_RECIPIENTS = 1000  # a DSN naming more is read this far (only the job's own address counts anyway)
# The actions seen in the wild for RFC 3464's five, by their first word.
_ACTIONS = {"failure": "failed", "fail": "failed", "delay": "delayed"}
_SMTP_REPLY = re.compile(r"\s*([245])\d\d\b")


def parse(message: EmailMessage) -> BounceReport | None:
    """The report of a DSN, or None when ``message`` is not one."""
    part = _status_part(message)
    if part is None:
        return None
    failed: list[tuple[str, MailReportKind, str | None, str | None]] = []
    # The first block is about the message; a malformed DSN may lack it, so recipients are the
    # blocks that name one.
    blocks = [b for b in _blocks(part) if b.get("Final-Recipient") or b.get("Original-Recipient")]
    if not blocks:
        return None
    for block in blocks[:MAX_RECIPIENTS]:
        # The address we sent to; where a forward took it is only the next best thing.
        recipient = address_of(block.get("Original-Recipient")) or address_of(block.get("Final-Recipient"))
        if _action(block) != "failed" or not recipient:
            continue
        diagnostic = _one_line(block.get("Diagnostic-Code"))
        diagnostic = diagnostic.partition(";")[2].strip() if diagnostic and ";" in diagnostic else diagnostic
        status, diagnostic = _status(_one_line(block.get("Status")) or "", diagnostic)
        failed.append((recipient, failure_kind(status, diagnostic), status, diagnostic))
    if not failed:
        actions = sorted({_action(b) for b in blocks if b.get("Action")})
        reason = f"delivery status notification: {', '.join(actions) or 'no recipient failed'}"
        return BounceReport(MailReportKind.NOT_BOUNCE, reason=reason, parser="dsn")
    kind = MailReportKind.HARD if any(k is MailReportKind.HARD for _, k, _, _ in failed) else MailReportKind.SOFT
    _, _, status, diagnostic = next(f for f in failed if f[1] is kind)
    recipients = tuple(dict.fromkeys(r for r, _, _, _ in failed))
    return BounceReport(kind, recipients, status, diagnostic, parser="dsn",
                        per_recipient=tuple(RecipientStatus(*f) for f in failed))


def _action(block: Message) -> str:
    """``failed (Bad destination mailbox address)`` -> ``failed``; ``Failure`` -> ``failed``."""
    words = str(block.get("Action", "")).lower().replace("(", " ").replace(";", " ").split()
    first = words[0].strip(".,:") if words else ""
    return _ACTIONS.get(first, first)


def _status(field: str, diagnostic: str | None) -> tuple[str | None, str | None]:
    """The RFC 3463 status of a failed recipient, and the text that explains it.

    ``Status: 5.1.1`` as written; else the one the diagnostic quotes; else an SMTP reply code in
    either field stands for its class (``553 ...`` -> 5.0.0, which says nothing more: the text
    decides hard or soft), and a status field that held text is that text when nothing else does."""
    status = status_in(field) or status_in(diagnostic)
    if status:
        return status, diagnostic
    for text in (field, diagnostic):
        reply = _SMTP_REPLY.match(text or "")
        if reply:
            return f"{reply.group(1)}.0.0", diagnostic or field
    return None, diagnostic


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
