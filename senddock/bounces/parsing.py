"""One message that came back, read: what it is (``parse_bounce_message``) and which job it is
about (the token). Nothing here touches the database: ``bounces parse`` is this and a printer."""

from __future__ import annotations

import email
import email.policy
import email.utils
import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import datetime, timezone

import structlog

from senddock.bounces.matching import JobMatch, find_job
from senddock.config import Config
from senddock.outcome import BounceReport, MailReportKind
from senddock.sizes import format_size

log = structlog.get_logger(__name__)

MAX_HEADER = 8 * 1024  # characters of one header field read: a bounce needs far fewer
# What is kept of a text from a message (a diagnostic, a subject), an address and a status.
MAX_TEXT, MAX_ADDRESS, MAX_STATUS = 2000, 320, 32
# Control characters but tab, line feed and carriage return: Postgres text refuses NUL, and no
# address, status or diagnostic has a reason to hold the others.
_UNSTORABLE = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
# A report's Date older than this is no date a bounce of ours could carry (`Dec 1` is year 1).
_EARLIEST = datetime(2000, 1, 1, tzinfo=timezone.utc)


class _BoundedPolicy(email.policy.EmailPolicy):
    """``email.policy.default`` that reads at most MAX_HEADER characters of any header field.

    The standard library parses a header's encoded words and addresses in time and memory that grow
    with the square of their number: a 700 KB Subject of ``=?utf-8?q?a?=`` words took 73 s and 17 GB.
    Anyone can mail the bounce address; nobody gets to do that to it."""

    def header_fetch_parse(self, name, value):  # noqa: ANN001 - the email package's signature
        return super().header_fetch_parse(name, value[:MAX_HEADER])


READING_POLICY = _BoundedPolicy()


@dataclass(frozen=True)
class ParsedMail:
    report: BounceReport
    match: JobMatch
    key: str  # the message's identity: the same message arriving again is a replay
    size: int
    too_large: bool = False
    date: datetime | None = None  # when the report was written (its Date, never in the future)


def parse_mail(config: Config, raw: bytes, envelope_recipients: Iterable[str] = ()) -> ParsedMail:
    """Never raises: a message nothing can read is ``not_bounce`` ("unreadable: ..."), counted and
    passed over, so one piece of garbage cannot stop an intake."""
    limit = config.bounces.max_message_size
    if len(raw) > limit:
        report = BounceReport(MailReportKind.NOT_BOUNCE, parser="limit",
                              reason=f"not read: larger than bounces.max_message_size ({format_size(limit)})")
        return ParsedMail(report, JobMatch(), _hash_key(raw), len(raw), too_large=True)
    try:
        return _parse(config, raw, envelope_recipients)
    except (Exception, RecursionError) as exc:  # noqa: BLE001 - e.g. parts nested thousands deep
        log.warning("bounce_unreadable", error=f"{type(exc).__name__}: {exc}"[:200])
        report = BounceReport(MailReportKind.NOT_BOUNCE, parser="error", reason=f"unreadable: {type(exc).__name__}")
        return ParsedMail(report, JobMatch(), _hash_key(raw), len(raw))


def _parse(config: Config, raw: bytes, envelope_recipients: Iterable[str]) -> ParsedMail:
    message = email.message_from_bytes(raw, policy=READING_POLICY)
    report = _report(config, message)
    match = find_job(message, config.bounces.secrets, envelope_recipients)
    message_id = _message_id(message)
    # A relay that retries sends the same bytes; the same DSN in a mailbox has more Received lines
    # but the same Message-ID, and without one the same body. Named with the job: a made-up message
    # reusing a real DSN's Message-ID cannot shadow it, since it cannot name the job.
    job = match.job
    identity = f"mid:{message_id}" if message_id else _hash_key(_body(raw))
    key = f"{identity}|{job.broadcast_id}.{job.job_id}" if job else identity
    return ParsedMail(report, match, key, len(raw), date=_date(message))


def _date(message: email.message.EmailMessage) -> datetime | None:
    """The report's Date, never in the future; None for none, or one no bounce can have (before
    2000, or an offset past a day: `Mon, 07 Dec 1 16:20:00 -2359`)."""
    try:
        when = email.utils.parsedate_to_datetime(str(message.get("Date", "")))
        if when.tzinfo is None:
            when = when.replace(tzinfo=timezone.utc)
        when = when.astimezone(timezone.utc)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when < _EARLIEST:
        return None
    return min(when, datetime.now(timezone.utc))


def storable(text: object, limit: int = MAX_TEXT) -> str | None:
    """``text`` as Postgres text can hold it and a log line or a page can show it: NUL and other
    control characters dropped, what does not encode as UTF-8 (the surrogates of undecodable bytes)
    replaced, at most ``limit`` characters. Every text a message brings goes through this before
    it reaches SQL: one message must not make its intake fail, let alone every time it is retried."""
    if text is None:
        return None
    text = _UNSTORABLE.sub("", str(text)[: limit * 2])
    return text.encode("utf-8", "replace").decode("utf-8")[:limit]


def _storable_report(report: BounceReport) -> BounceReport:
    """The report a parser (a plugin's too) returned, with every text made storable; an address
    that is no address once cleaned is left out."""
    def address(value: object) -> str | None:
        cleaned = storable(value, MAX_ADDRESS)
        return cleaned if cleaned and "@" in cleaned and " " not in cleaned else None

    per_recipient = tuple(
        replace(r, address=a, status=storable(r.status, MAX_STATUS), reason=storable(r.reason))
        for r in report.per_recipient if (a := address(r.address)) is not None)
    return replace(report, recipients=tuple(a for r in report.recipients if (a := address(r)) is not None),
                   status=storable(report.status, MAX_STATUS), reason=storable(report.reason),
                   parser=storable(report.parser, 100) or "", per_recipient=per_recipient)


def _body(raw: bytes) -> bytes:
    """What follows the header block, line ends made LF: what no server on the way changes (they
    add Received and Delivered-To lines; POP3 hands out CRLF, a Maildir file may hold LF)."""
    raw = raw.replace(b"\r\n", b"\n")
    _, separator, body = raw.partition(b"\n\n")
    return body if separator else raw


def _report(config: Config, message: email.message.EmailMessage) -> BounceReport:
    pm = config.plugin_manager
    try:
        report = pm.hook.parse_bounce_message(message=message, config=config)
    except Exception as exc:  # noqa: BLE001 - a plugin's bug or garbage the parsers choke on
        log.error("bounce_parse_failed", error=repr(exc))
        return BounceReport(MailReportKind.NOT_BOUNCE, parser="error", reason=f"unreadable: {type(exc).__name__}")
    if not isinstance(report, BounceReport):
        log.error("bounce_parse_failed", error=f"parse_bounce_message returned {type(report).__name__}")
        return BounceReport(MailReportKind.NOT_BOUNCE, parser="error", reason="no parser answered")
    return _storable_report(report)


def _hash_key(raw: bytes) -> str:
    return "sha256:" + hashlib.sha256(raw).hexdigest()


def _message_id(message: email.message.EmailMessage) -> str | None:
    try:
        value = message.get("Message-ID")
    except Exception:  # noqa: BLE001
        return None
    return storable(" ".join(str(value).split()), 500) if value else None
