"""One message that came back, read: what it is (``parse_bounce_message``) and which job it is
about (the token). Nothing here touches the database: ``bounces parse`` is this and a printer."""

from __future__ import annotations

import email
import email.policy
import hashlib
from collections.abc import Iterable
from dataclasses import dataclass

import structlog

from senddock.bounces.matching import JobMatch, find_job
from senddock.config import Config
from senddock.mail import verp
from senddock.outcome import BounceReport, MailReportKind
from senddock.sizes import format_size, parse_size

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class ParsedMail:
    report: BounceReport
    match: JobMatch
    key: str  # the message's identity: the same message arriving again is a replay
    size: int
    too_large: bool = False


def parse_mail(config: Config, raw: bytes, envelope_recipients: Iterable[str] = ()) -> ParsedMail:
    section = config.section("bounces")
    limit = parse_size(section.get("max_message_size") or "10MiB")
    if len(raw) > limit:
        report = BounceReport(MailReportKind.NOT_BOUNCE, parser="limit",
                              reason=f"not read: larger than bounces.max_message_size ({format_size(limit)})")
        return ParsedMail(report, JobMatch(), _hash_key(raw), len(raw), too_large=True)
    message = email.message_from_bytes(raw, policy=email.policy.default)
    report = _report(config, message)
    secrets = verp.secrets_of(section.get("secret"))
    try:
        match = find_job(message, secrets, envelope_recipients)
    except Exception as exc:  # noqa: BLE001 - garbage that breaks the header parser names no job
        match = JobMatch(forged=f"unreadable headers: {type(exc).__name__}")
    message_id = _message_id(message)
    # A relay that retries sends the same bytes; the same DSN fetched from a mailbox has more
    # Received lines but the same Message-ID. Named with the job: a made-up message reusing a real
    # DSN's Message-ID cannot shadow it, since it cannot name the job.
    job = match.job
    key = (f"mid:{message_id}|{job.broadcast_id}.{job.job_id}" if job else f"mid:{message_id}") if message_id \
        else _hash_key(raw)
    return ParsedMail(report, match, key, len(raw))


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
