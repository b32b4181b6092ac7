"""One message that came back, read: what it is (``parse_bounce_message``) and which job it is
about (the token). Nothing here touches the database: ``bounces parse`` is this and a printer."""

from __future__ import annotations

import email
import email.policy
import email.utils
import hashlib
from datetime import datetime, timezone
from collections.abc import Iterable
from dataclasses import dataclass

import structlog

from senddock.bounces.matching import JobMatch, find_job
from senddock.config import Config
from senddock.mail import verp
from senddock.outcome import BounceReport, MailReportKind
from senddock.sizes import format_size, parse_size

log = structlog.get_logger(__name__)

MAX_HEADER = 8 * 1024  # characters of one header field read: a bounce needs far fewer


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


def max_message_size(config: Config) -> int:
    """``bounces.max_message_size`` in bytes: what every intake reads of a message at most."""
    return parse_size(config.section("bounces").get("max_message_size", "10MiB"))


def parse_mail(config: Config, raw: bytes, envelope_recipients: Iterable[str] = ()) -> ParsedMail:
    """Never raises: a message nothing can read is ``not_bounce`` ("unreadable: ..."), counted and
    passed over, so one piece of garbage cannot stop an intake."""
    limit = max_message_size(config)
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
    match = find_job(message, verp.secrets_of(config.section("bounces").get("secret")), envelope_recipients)
    message_id = _message_id(message)
    # A relay that retries sends the same bytes; the same DSN in a mailbox has more Received lines
    # but the same Message-ID, and without one the same body. Named with the job: a made-up message
    # reusing a real DSN's Message-ID cannot shadow it, since it cannot name the job.
    job = match.job
    identity = f"mid:{message_id}" if message_id else _hash_key(_body(raw))
    key = f"{identity}|{job.broadcast_id}.{job.job_id}" if job else identity
    return ParsedMail(report, match, key, len(raw), date=_date(message))


def _date(message: email.message.EmailMessage) -> datetime | None:
    try:
        when = email.utils.parsedate_to_datetime(str(message.get("Date", "")))
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return min(when, datetime.now(timezone.utc))


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
    return report


def _hash_key(raw: bytes) -> str:
    return "sha256:" + hashlib.sha256(raw).hexdigest()


def _message_id(message: email.message.EmailMessage) -> str | None:
    try:
        value = message.get("Message-ID")
    except Exception:  # noqa: BLE001
        return None
    return " ".join(str(value).split())[:500] if value else None
