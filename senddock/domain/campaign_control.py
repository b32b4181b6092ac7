"""A campaign in flight: pause, resume, cancel, requeue, unsuppress, its rate; its status history
and its delivery log. (Creating, checking, sending and counting a campaign are in campaigns.py.)"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import class_row, dict_row

from senddock.domain.campaign_rate import send_rate_text
from senddock.domain.campaigns import OPERATOR_PAUSE, get_campaign
from senddock.store.queries import query
from senddock.errors import InvalidInput, InvalidState
from senddock.pacing.rates import campaign_rate_view
from senddock.store import outbox
from senddock.store.jobs import cancel_leftovers
from senddock.config.webhooks import NO_WEBHOOKS, Subscriptions
from senddock.wording import is_status

# Failure reasons about the address itself: requeueing them would mail someone who must not be.
NEVER_REQUEUED = ("bounced", "complained", "unsubscribed", "suppressed")


@dataclass(frozen=True)
class CampaignEvent:
    """One change of a campaign's status, recorded by the database in the transaction that made it."""

    id: int
    at: datetime
    from_status: str | None
    to_status: str
    reason: str | None
    auto_resume: bool
    actor: str | None  # application_name: `senddock-run NODE` (a node), senddock (the CLI or the API),
    # `senddock-dashboard USER` (an action in the dashboard): see actor_words

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def actor_words(application_name: str | None) -> str:
    """Who made a change, from the session's application_name: nodes connect as `senddock-run NODE`,
    the CLI and the API as senddock, the dashboard's actions as `senddock-dashboard USER`."""
    name = application_name or "-"
    if name.startswith("senddock-run "):
        return f"node {name.removeprefix('senddock-run ')}"
    if name.startswith("senddock-dashboard "):
        return f"dashboard ({name.removeprefix('senddock-dashboard ')})"
    return {"senddock": "CLI or API", "senddock-serve": "serve"}.get(name, name)


def campaign_events(conn: psycopg.Connection, campaign_id: int, limit: int = 20) -> list[CampaignEvent]:
    """Its latest status changes, newest first."""
    get_campaign(conn, campaign_id)  # NotFound for an unknown id
    with conn.cursor(row_factory=class_row(CampaignEvent)) as cur:
        return cur.execute(query("campaign_events"), {"campaign_id": campaign_id, "limit": limit}).fetchall()


def pause_campaign(conn: psycopg.Connection, campaign_id: int, reason: str = OPERATOR_PAUSE, *,
                   webhooks: Subscriptions = NO_WEBHOOKS) -> None:
    """No more of its jobs are claimed (every node checks before each send); in-flight sends finish."""
    params = {"campaign_id": campaign_id, "reason": reason, "auto_resume": False, "probe_in": 0}
    with conn.transaction():
        paused = conn.execute(query("campaign_pause"), params).fetchone() is not None
        if paused:
            outbox.emit(conn, webhooks, [outbox.event("campaign_paused", campaign_id=campaign_id, reason=reason,
                                                      auto_resume=False)])
    if not paused:
        status = get_campaign(conn, campaign_id).status
        raise InvalidState(f"campaign {campaign_id} {is_status(status)}: only a sending or scheduled campaign can be paused")


def cancel_campaign(conn: psycopg.Connection, campaign_id: int) -> int:
    """Fail every unsent job as cancelled; returns how many. Sent jobs are untouched."""
    with conn.transaction():
        row = conn.execute(query("campaign_cancel"), {"campaign_id": campaign_id}).fetchone()
        if row is None:
            status = get_campaign(conn, campaign_id).status
            raise InvalidState(f"campaign {campaign_id} {is_status(status)}: there is nothing left to cancel")
        cancel_leftovers(conn)
    return row[1]


def requeue_campaign(conn: psycopg.Connection, campaign_id: int, reason: str) -> int:
    """Put the failed jobs of ``reason`` back in line; returns how many (0 when every one of them is
    of an address suppressed since). A reason none of its jobs failed for is refused, naming those
    that it has: a typo must not pass for "nothing to requeue"."""
    if reason in NEVER_REQUEUED:
        raise InvalidInput(f"{{=reason}} {reason}: jobs failed as {reason} are about the address itself and are "
                           f"never requeued ({', '.join(NEVER_REQUEUED)})")
    with conn.transaction():
        row = conn.execute(query("campaign_requeue"), {"campaign_id": campaign_id, "reason": reason}).fetchone()
        if row is None:
            status = get_campaign(conn, campaign_id).status
            raise InvalidState(f"campaign {campaign_id} {is_status(status)}: only a sending, paused or finished campaign "
                               "can be requeued")
        if row[2]:
            conn.execute(query("notify_jobs"), {"broadcast_id": row[1]})
        else:
            with conn.cursor(row_factory=dict_row) as cur:
                failed = cur.execute(query("broadcast_counts"), {"broadcast_id": row[1]}).fetchone()
            if reason not in failed["failed_by_reason"]:
                # A typo must not read as "0 jobs requeued": say which reasons there are.
                raise InvalidInput(_no_such_failure(campaign_id, reason, failed["failed_by_reason"]))
    return row[2]


def _no_such_failure(campaign_id: int, reason: str, failed_by_reason: dict[str, int]) -> str:
    message = f"{{=reason}} {reason}: campaign {campaign_id} has no jobs that failed as {reason}"
    if not failed_by_reason:
        return message + "; it has no failed jobs at all"
    requeueable = [f"{r} {n}" for r, n in failed_by_reason.items() if r not in NEVER_REQUEUED]
    never = [f"{r} {n}" for r, n in failed_by_reason.items() if r in NEVER_REQUEUED]
    message += f"; its failed jobs by reason: {', '.join(requeueable) if requeueable else 'none that can be requeued'}"
    if never:
        message += f"; never requeued (about the address itself): {', '.join(never)}"
    return message


def resume_campaign(conn: psycopg.Connection, campaign_id: int) -> None:
    with conn.transaction():
        resumed = conn.execute(query("campaign_resume"), {"campaign_id": campaign_id}).fetchone()
        if resumed is None:
            status = get_campaign(conn, campaign_id).status
            raise InvalidState(f"campaign {campaign_id} {is_status(status)}, not paused: only a paused campaign can be resumed")
        broadcast_id = get_campaign(conn, campaign_id).broadcast_id
        conn.execute(query("notify_jobs"), {"broadcast_id": broadcast_id})


@dataclass(frozen=True)
class Unsuppressed:
    campaign_id: int
    unsuppressed: int  # suppressions removed
    requeued: int  # their jobs, back in line


def unsuppress_campaign(conn: psycopg.Connection, campaign_id: int, *, since_pause: bool) -> Unsuppressed:
    """Undo the suppressions a campaign's bounces made (``since_pause``: only those of the window that
    tripped its bounce-rate breaker) and put their jobs back in line."""
    with conn.transaction():
        campaign = get_campaign(conn, campaign_id)
        if campaign.broadcast_id is None:
            raise InvalidState(f"campaign {campaign_id} {is_status(campaign.status)}: it has not been sent")
        if since_pause and campaign.bounce_window_from is None:
            raise InvalidState(f"campaign {campaign_id} was never paused for its bounce rate: nothing to undo "
                               "{=since_pause} ({=all} undoes every suppression its bounces made)")
        row = conn.execute(query("campaign_unsuppress"),
                           {"campaign_id": campaign_id, "since_pause": since_pause}).fetchone()
        if row[4]:
            conn.execute(query("notify_jobs"), {"broadcast_id": campaign.broadcast_id})
    return Unsuppressed(campaign_id, unsuppressed=row[3], requeued=row[4])


def delivery_log(conn: psycopg.Connection, campaign_id: int, *, email: str | None = None, outcome: str | None = None,
                 in_doubt: bool = False, limit: int | None = None) -> list[dict[str, Any]]:
    """Every attempt of the campaign's broadcast, oldest first (the first ``limit`` of them); ``in_doubt``:
    only the attempts of recipients who may have received two copies."""
    broadcast_id = get_campaign(conn, campaign_id).broadcast_id
    if broadcast_id is None:
        return []
    params = {"broadcast_id": broadcast_id, "email": email, "outcome": outcome, "in_doubt": in_doubt, "limit": limit}
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(query("delivery_log"), params).fetchall()


@dataclass(frozen=True)
class RateSet:
    """A campaign's own rate changed (`campaign set-rate`): stored forms, None for none."""

    campaign_id: int
    status: str
    rate: str | None
    previous_rate: str | None

    def as_dict(self) -> dict[str, Any]:
        """As `--json` shows it: each rate as the config spells one, ``{"rate": "100/min", "burst": 1}``."""
        return {"campaign_id": self.campaign_id, "status": self.status, "rate": campaign_rate_view(self.rate),
                "previous_rate": campaign_rate_view(self.previous_rate)}


def set_campaign_rate(conn: psycopg.Connection, campaign_id: int, rate: str, burst: int | None = None) -> RateSet:
    """Give the campaign its own rate (``100/min``, with ``burst``), or none (``rate="none"``): any
    campaign with sends still to come. Every node applies it from its next claim (the claim reads it with each job)."""
    send_rate = send_rate_text(rate, burst)
    row = conn.execute(query("campaign_set_rate"), {"campaign_id": campaign_id, "send_rate": send_rate}).fetchone()
    if row is None:
        status = get_campaign(conn, campaign_id).status  # NotFound for an unknown id
        raise InvalidState(f"campaign {campaign_id} {is_status(status)}: nothing more of it is sent, so its rate "
                           "cannot change (only a draft, scheduled, sending or paused campaign's can); "
                           f"`senddock campaign clone {campaign_id}` makes a draft with its rate")
    return RateSet(campaign_id, status=row[0], rate=send_rate, previous_rate=row[1])

