"""Applying what providers report after the send: bounces and complaints suppress (through the
``on_bounced`` hooks), transient bounces and deliveries are recorded on the job's event log.

Each event is matched to its job by the provider's message id, or by the job id the transport
tagged the message with, and only when the event's address is the job's. Each event is recorded
once (``event_key``): the same notifications applied twice change nothing the second time. Hooks
run after the event's commit, outside any transaction; ``hooks_done`` turns true once they all
returned, so a crash in between re-runs them when the notification arrives again.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any

import pluggy
import psycopg
import structlog
from psycopg.rows import dict_row

from senddock.config import Config
from senddock.store.db import Database
from senddock.store.queries import query
from senddock.store.jobs import bounce_check
from senddock.mail.mime import comparable_address
from senddock.outcome import (
    Bounce,
    BounceKind,
    BounceSource,
    JobRef,
    ProviderEvent,
    SuppressionList,
)
from senddock.store import outbox
from senddock.config.webhooks import subscriptions

log = structlog.get_logger(__name__)


class UnknownMessage(LookupError):
    """No job sent this message (yet): SNS should deliver the notification again later."""


@dataclass
class Applied:
    recorded: int = 0  # new events
    already_recorded: int = 0
    suppressed: list[str] = field(default_factory=list)  # addresses whose hooks ran now
    hooks_failed: list[str] = field(default_factory=list)


def apply_events(
    db: Database, pm: pluggy.PluginManager, config: Config, suppressions: SuppressionList,
    events: list[ProviderEvent],
) -> Applied:
    """Record the events of one notification; raises UnknownMessage (recording none of them) when
    one of them matches no job."""
    applied = Applied()
    webhooks = subscriptions(config.data)
    with db.connection() as conn, conn.transaction():
        jobs = [_job_for(conn, event) for event in events]
        events = [_soft_policy(conn, config, event, job) for event, job in zip(events, jobs)]
        rows = [_record(conn, event, job) for event, job in zip(events, jobs)]
        # Once per event: a notification that arrives again announces nothing new.
        outbox.emit(conn, webhooks, [announced for event, job, row in zip(events, jobs, rows)
                                     if row["new"] and (announced := _webhook_event(event, job)) is not None])
    for event, job, row in zip(events, jobs, rows):
        if row["new"] and event.kind == "bounce" and event.bounce_type == "Permanent":
            _bounce_rate_breaker(db, config, job)
        if row["new"]:
            applied.recorded += 1
            log.info("provider_event", kind=event.kind, email=event.email, job_id=job["id"],
                     bounce_type=event.bounce_type, sub_type=event.sub_type, suppresses=event.suppresses)
        else:
            applied.already_recorded += 1
        if not event.suppresses or row["hooks_done"]:
            continue
        if _run_hooks(pm, config, suppressions, event, job):
            with db.connection() as conn:
                conn.execute(query("event_hooks_done"), {"event_id": row["id"]})
            applied.suppressed.append(job["email"])
        else:
            applied.hooks_failed.append(job["email"])
    return applied


def _bounce_rate_breaker(db: Database, config: Config, job: dict[str, Any]) -> None:
    """A hard bounce after the send counts in its campaign's bounce rate as one at the send does:
    a campaign still sending pauses when they pile up (its bounces by mail are real: they stay)."""
    breaker = config.breaker
    with db.connection() as conn:
        tripped, _ = bounce_check(conn, subscriptions(config.data), job["campaign_id"], job["broadcast_id"], breaker)
    if tripped:
        log.warning("campaign_paused", campaign_id=job["campaign_id"], reason="bounce_rate",
                    resumes="by `campaign resume` once the bounces are understood")


def _webhook_event(event: ProviderEvent, job: dict[str, Any]) -> dict[str, Any] | None:
    """A complaint, or a bounce that suppresses (hard, or soft at bounces.soft.limit): what a
    receiver acts on. A soft bounce that changes nothing is recorded, not announced."""
    if event.kind not in ("bounce", "complaint") or (event.kind == "bounce" and not event.suppresses):
        return None
    ids = {"campaign_id": job["campaign_id"], "broadcast_id": job["broadcast_id"], "job_id": job["id"],
           "email": job["email"], "source": "mail" if event.event_key.startswith("mail:") else "notification"}
    if event.kind == "complaint":
        return outbox.event("complained", **ids, feedback_type=event.sub_type, diagnostic=event.diagnostic[:500])
    return outbox.event("bounced", **ids, bounce_type="hard" if event.bounce_type == "Permanent" else "soft",
                        code=None, enhanced_code=event.sub_type, diagnostic=event.diagnostic[:500])


def _job_for(conn: psycopg.Connection, event: ProviderEvent) -> dict[str, Any]:
    with conn.cursor(row_factory=dict_row) as cur:
        job = None
        if event.provider_message_id:
            job = cur.execute(query("event_job_by_message_id"),
                              {"provider_message_id": event.provider_message_id}).fetchone()
        if job is None and event.job_id is not None:
            job = cur.execute(query("event_job_by_id"), {"job_id": event.job_id}).fetchone()
    # Transports send internationalised domains in their IDNA form, which is what providers report.
    if job is None or comparable_address(job["email"]) != comparable_address(event.email):
        what = f"message id {event.provider_message_id}" if event.provider_message_id else f"job {event.job_id}"
        raise UnknownMessage(f"no job sent {what} to {event.email}")
    return job


def _soft_policy(conn: psycopg.Connection, config: Config, event: ProviderEvent, job: dict[str, Any]) -> ProviderEvent:
    """A soft bounce (Transient) suppresses once it is the ``bounces.soft.limit``-th of its
    address within ``bounces.soft.window``, with no delivery in between: mailbox full for weeks
    is as dead as an address gets, once is a holiday."""
    if event.kind != "bounce" or event.bounce_type != "Transient" or event.suppresses or not event.about_recipient:
        return event
    soft = config.bounces.soft
    window = soft.window
    if _age(event.occurred_at) > window:
        return event  # an old report (an archive, a backlog): recorded, it counts for nothing now
    params = {"email": event.email, "job_id": job["id"], "window": window}
    others = conn.execute(query("soft_bounces_recent"), params).fetchone()[0]
    return replace(event, suppresses=others + 1 >= soft.limit)


def _age(occurred_at: str | None) -> float:
    """Seconds since an ISO 8601 time (0 when unknown, unreadable or in the future)."""
    if not occurred_at:
        return 0.0
    try:
        when = datetime.fromisoformat(occurred_at.replace("Z", "+00:00"))
    except ValueError:
        return 0.0
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return max(0.0, (datetime.now(timezone.utc) - when).total_seconds())


def _record(conn: psycopg.Connection, event: ProviderEvent, job: dict[str, Any]) -> dict[str, Any]:
    params = {
        "event_key": event.event_key, "job_id": job["id"], "broadcast_id": job["broadcast_id"],
        "provider_message_id": event.provider_message_id, "email": event.email, "kind": event.kind,
        "bounce_type": event.bounce_type, "sub_type": event.sub_type, "suppresses": event.suppresses,
        "diagnostic": event.diagnostic[:2000].replace("\x00", ""), "occurred_at": event.occurred_at,
        "about_recipient": event.about_recipient,
    }
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(query("event_record"), params).fetchone()


def _run_hooks(pm: pluggy.PluginManager, config: Config, suppressions: SuppressionList, event: ProviderEvent,
               job: dict[str, Any]) -> bool:
    bounce = Bounce(
        email=job["email"],  # as senddock stores it: the provider may spell the domain in IDNA form
        kind=BounceKind.COMPLAINT if event.kind == "complaint" else BounceKind.BOUNCE,
        source=BounceSource.NOTIFICATION,
        enhanced_code=event.sub_type,
        diagnostic=event.diagnostic,
        job=JobRef(job["id"], job["broadcast_id"], job["campaign_id"]),
        soft=event.kind == "bounce" and event.bounce_type == "Transient",
    )
    try:
        pm.hook.on_bounced(bounce=bounce, suppressions=suppressions, config=config)
    except Exception as exc:  # noqa: BLE001 - reported; the event stays pending for the next arrival
        log.error("plugin_failed", hook="on_bounced", error=repr(exc), email=event.email)
        return False
    return True
