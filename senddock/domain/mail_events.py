"""Applying a message that came back by mail: one counted outcome each, and for a bounce or a
complaint about one of our jobs, the same delivery event and policy as a provider's notification.

Only a verified token names the job (senddock.bounces.matching), and the job's own address must be
among those the report names (a complaint whose provider redacted the recipient names none): a
bounce for someone else, for a deleted campaign's job, or with a forged token suppresses nobody.
Hard bounces and complaints suppress at once; a soft bounce suppresses once it is the
``bounces.soft.limit``-th within ``bounces.soft.window`` with no delivery in between. The
message's row commits after its event, so a crash in between leaves a message that, read again,
applies as a replay (the event is recorded once, pending hooks run).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import pluggy
import psycopg
import structlog
from psycopg.rows import dict_row

from senddock.bounces.parsing import ParsedMail, storable
from senddock.bounces.status import blames_us
from senddock.config import Config
from senddock.store.db import Database
from senddock.domain.events import UnknownMessage, apply_events
from senddock.store.queries import query
from senddock.mail.mime import comparable_address
from senddock.outcome import BounceReport, MailReportKind, ProviderEvent, SuppressionList

log = structlog.get_logger(__name__)

OUTCOMES = ("applied", "ignored", "forged", "unattributed", "unknown_job", "address_mismatch", "too_large",
            "unreadable")
_BOUNCES = (MailReportKind.HARD, MailReportKind.SOFT, MailReportKind.COMPLAINT)


@dataclass(frozen=True)
class MailOutcome:
    outcome: str  # one of OUTCOMES
    replayed: bool = False  # this message was read before (its first outcome stands)
    suppressed: bool = False  # the address is suppressed now, by this message
    hooks_failed: bool = False  # on_bounced raised: reading the message again retries it
    detail: str | None = None


def apply_mail(db: Database, pm: pluggy.PluginManager, config: Config, suppressions: SuppressionList,
               parsed: ParsedMail, *, via: str, origin: str | None) -> MailOutcome:
    """One message's outcome, recorded (``inbound_mail``). Raises only when the database cannot be
    reached (psycopg's OperationalError): try the message again later. Anything else it cannot
    apply (a text the database refuses that the parsers did not clean, a plugin's or senddock's
    bug) is the counted outcome ``unreadable``, recorded as such and logged once: one message
    never stops an intake, nor comes back forever."""
    origin = storable(origin, 500)
    try:
        return _apply(db, pm, config, suppressions, parsed, via=via, origin=origin)
    except psycopg.OperationalError:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever it is, it is this message's, not the intake's
        return _unreadable(db, parsed, via, origin, exc)


def _apply(db: Database, pm: pluggy.PluginManager, config: Config, suppressions: SuppressionList,
           parsed: ParsedMail, *, via: str, origin: str | None) -> MailOutcome:
    with db.connection() as conn:
        replayed = conn.execute(query("inbound_mail_seen"), {"mail_key": parsed.key}).fetchone() is not None
    result = _outcome(db, pm, config, suppressions, parsed, replayed)
    job, report = parsed.match.job, parsed.report
    _record(db, parsed, via, origin, result.outcome, job, report.recipients, report.status, report.reason)
    log.info("bounce_mail", via=via, origin=origin, kind=report.kind.value, outcome=result.outcome,
             replayed=result.replayed or None, suppressed=result.suppressed or None,
             job_id=job and job.job_id, status=report.status, detail=result.detail)
    return result


def _unreadable(db: Database, parsed: ParsedMail, via: str, origin: str | None, exc: Exception) -> MailOutcome:
    """Recorded with nothing of its content but its key and size (that may be what failed)."""
    error = storable(f"{type(exc).__name__}: {exc}", 300)
    log.warning("bounce_unreadable", via=via, origin=origin, error=error,
                meaning="this message could not be applied: counted as unreadable, not tried again")
    try:
        _record(db, parsed, via, origin, "unreadable", None, (), None, error)
    except psycopg.OperationalError:
        raise
    except Exception as again:  # noqa: BLE001 - said once; the outcome stands
        log.error("bounce_unreadable_not_recorded", origin=origin, error=storable(repr(again), 300))
    return MailOutcome("unreadable", detail=error)


def _record(db: Database, parsed: ParsedMail, via: str, origin: str | None, outcome: str, job,
            recipients, status: str | None, reason: str | None) -> None:
    with db.connection() as conn:
        conn.execute(query("inbound_mail_record"), {
            "mail_key": parsed.key, "via": via, "origin": origin, "kind": parsed.report.kind.value,
            "outcome": outcome, "job_id": job and job.job_id, "broadcast_id": job and job.broadcast_id,
            "recipients": list(recipients[:100]), "status": status, "reason": storable(reason) or None,
            "size": parsed.size})


def _outcome(db: Database, pm: pluggy.PluginManager, config: Config, suppressions: SuppressionList,
             parsed: ParsedMail, replayed: bool) -> MailOutcome:
    report, match = parsed.report, parsed.match
    if parsed.too_large:
        return MailOutcome("too_large", replayed, detail=report.reason)
    if report.kind not in _BOUNCES:
        return MailOutcome("ignored", replayed, detail=report.kind.value)
    if match.job is None:
        if match.forged:
            return MailOutcome("forged", replayed, detail=match.forged)
        detail = ("no signed token names a job" if config.bounces.secrets
                  else "bounces.secret is not set: no token can be verified")
        return MailOutcome("unattributed", replayed, detail=detail)
    with db.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
        job = cur.execute(query("event_job_by_id"), {"job_id": match.job.job_id}).fetchone()
    if job is None or job["broadcast_id"] != match.job.broadcast_id:
        return MailOutcome("unknown_job", replayed, detail=f"job {match.job.job_id} of broadcast "
                                                           f"{match.job.broadcast_id} no longer exists")
    address = comparable_address(job["email"])
    named = {comparable_address(r) for r in report.recipients}
    if named and address not in named:
        return MailOutcome("address_mismatch", replayed,
                           detail=f"the report names {', '.join(sorted(named)[:3])}, job {job['id']} was sent to "
                                  f"{job['email']}")
    own = next((r for r in report.per_recipient if comparable_address(r.address) == address), None)
    if own is not None:  # a DSN naming several: the job's address is judged by its own line
        report = replace(report, kind=own.kind, status=own.status, reason=own.reason)
    event = _event(parsed, report, job)
    try:
        applied = apply_events(db, pm, config, suppressions, [event])
    except UnknownMessage as exc:  # deleted between the lookup and the record
        return MailOutcome("unknown_job", replayed, detail=str(exc))
    return MailOutcome("applied", replayed or bool(applied.already_recorded), suppressed=bool(applied.suppressed),
                       hooks_failed=bool(applied.hooks_failed))


def _event(parsed: ParsedMail, report: BounceReport, job: dict) -> ProviderEvent:
    kind = "complaint" if report.kind is MailReportKind.COMPLAINT else "bounce"
    bounce_type = {MailReportKind.HARD: "Permanent", MailReportKind.SOFT: "Transient"}.get(report.kind)
    return ProviderEvent(  # a soft bounce's suppresses is the soft policy's to decide (apply_events)
        kind=kind, email=job["email"], provider_message_id=None, event_key=f"mail:{parsed.key}:{job['email'].lower()}",
        suppresses=report.kind is not MailReportKind.SOFT, bounce_type=bounce_type,
        sub_type=report.status, diagnostic=report.reason or "", job_id=job["id"],
        occurred_at=parsed.date.isoformat() if parsed.date else None,
        # A refusal of our message (policy, content) is recorded and never counts towards
        # bounces.soft.limit: it says nothing about the address.
        about_recipient=not (report.kind is MailReportKind.SOFT and blames_us(report.status, report.reason)))
