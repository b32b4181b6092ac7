"""Which job a message that came back is about: only senddock's own signed token says.

Looked for where our mail leaves it: the address the message came back to (the SMTP envelope at
``bounces receive``, else the headers a mailbox delivery records: Delivered-To, X-Original-To,
To...), a feedback report's Original-Mail-From, and the returned message's Message-ID and
Return-Path. A parser's word, the X-Senddock-Job header or any other unsigned id counts for
nothing: ids are sequential, and anyone can send mail.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from email.message import Message

from senddock.bounces.arf import returned_headers
from senddock.mail import verp

# Headers of the bounce itself that hold the address it was delivered to.
_DELIVERY_HEADERS = ("Delivered-To", "X-Original-To", "Envelope-To", "X-Envelope-To", "X-Rcpt-To", "To")
# Headers of the returned message that carry our token (the Return-Path a receiver recorded is
# our envelope sender).
_RETURNED_HEADERS = ("Message-ID", "Return-Path")


@dataclass(frozen=True)
class JobMatch:
    """``job`` when a token verified; else ``forged`` says why the token-shaped values found did not."""

    job: verp.JobToken | None = None
    forged: str | None = None
    where: str | None = None  # which header (or "envelope") held the token


def find_job(message: Message, secrets: Sequence[str], envelope_recipients: Iterable[str] = ()) -> JobMatch:
    if not secrets:
        return JobMatch()  # without bounces.secret nothing can be verified: not forged, unattributed
    forged: str | None = None
    for where, value in _candidates(message, envelope_recipients):
        try:
            found = verp.find_token(secrets, value)
        except verp.BadToken as exc:
            forged = forged or f"{where}: {exc}"
            continue
        if found is not None:
            return JobMatch(found, where=where)
    return JobMatch(forged=forged)


def _candidates(message: Message, envelope_recipients: Iterable[str]) -> Iterable[tuple[str, str]]:
    for address in envelope_recipients:
        yield "envelope", address
    for name in _DELIVERY_HEADERS:
        for value in _values(message, name):
            yield name, value
    for part in message.walk():
        if part.get_content_type() == "message/feedback-report":
            payload = part.get_payload()
            fields = payload[0] if isinstance(payload, list) and payload else None
            for value in _values(fields, "Original-Mail-From") if fields is not None else ():
                yield "Original-Mail-From", value
    returned = returned_headers(message)
    if returned is not None:
        for name in _RETURNED_HEADERS:
            for value in _values(returned, name):
                yield f"returned {name}", value


def _values(message: Message, name: str) -> list[str]:
    try:
        return [str(v) for v in message.get_all(name) or ()]
    except Exception:  # noqa: BLE001 - a header the email package cannot parse names no job
        return []
