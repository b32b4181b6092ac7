"""Retention: a broadcast's per-recipient rows go once it has ended long enough ago, its campaign
keeping the counts it had (``campaign status`` shows the same figures after), and old inbound mail
records and status history go by age. Suppressions, subscribers and unsubscribes are never pruned.

Each campaign is pruned in a transaction of its own, its counts frozen in the same one: a process
killed mid-prune leaves every campaign either whole or pruned with its counts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from senddock.config.sections import RetentionSettings
from senddock.errors import InvalidState, NotFound
from senddock.store.queries import query

ENDED = ("finished", "cancelled")


@dataclass(frozen=True)
class Pruned:
    """One campaign's broadcast detail, pruned (or, in a dry run, what would be)."""

    campaign_id: int
    name: str
    broadcast_id: int
    rows: dict[str, int]
    pruned_at: datetime | None = None  # None in a dry run

    def as_dict(self) -> dict[str, Any]:
        return {"campaign_id": self.campaign_id, "name": self.name, "broadcast_id": self.broadcast_id,
                "rows": self.rows}


@dataclass(frozen=True)
class Skipped:
    """A due campaign left for a later prune, and why."""

    campaign_id: int
    reason: str

    def as_dict(self) -> dict[str, Any]:
        return {"campaign_id": self.campaign_id, "reason": self.reason}


@dataclass(frozen=True)
class PruneReport:
    dry_run: bool
    pruned: list[Pruned] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    expired: dict[str, int] = field(default_factory=dict)  # rows dropped by age, per table
    bytes_returned: int = 0  # disk given back at once (rows deleted return theirs after VACUUM)

    def as_dict(self) -> dict[str, Any]:
        return {"dry_run": self.dry_run, "pruned": [p.as_dict() for p in self.pruned],
                "skipped": [s.as_dict() for s in self.skipped], "expired": self.expired,
                "bytes_returned": self.bytes_returned}


def prune_campaign(conn: psycopg.Connection, campaign_id: int, *, dry_run: bool = False) -> Pruned:
    """Prune one ended campaign's broadcast detail now (``senddock prune --campaign``), whatever its
    age. Refused (InvalidState) while it sends, has sends in flight or bounces not yet applied."""
    with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        campaign = cur.execute(query("retention_campaign_lock"), {"campaign_id": campaign_id}).fetchone()
        if campaign is None:
            raise NotFound(f"no campaign with id {campaign_id}")
        if campaign["status"] not in ENDED:
            raise InvalidState(f"campaign {campaign_id} is {campaign['status']}: only an ended (finished or "
                               "cancelled) campaign's detail can be pruned")
        if campaign["broadcast_id"] is None:
            raise InvalidState(f"campaign {campaign_id} was never sent: it has no detail to prune")
        if campaign["pruned_at"] is not None:
            raise InvalidState(f"campaign {campaign_id}'s detail was pruned on {campaign['pruned_at']:%Y-%m-%d %H:%M %Z}")
        broadcast_id = campaign["broadcast_id"]
        blockers = cur.execute(query("retention_blockers"), {"broadcast_id": broadcast_id}).fetchone()
        if blockers["in_flight"]:
            raise InvalidState(f"campaign {campaign_id} has {blockers['in_flight']} sends in flight: prune it once "
                               "they are recorded")
        if blockers["unapplied_bounces"]:
            raise InvalidState(f"campaign {campaign_id} has {blockers['unapplied_bounces']} bounces not yet applied "
                               "(their suppressions are made from its jobs): prune it once a node has applied them")
        if dry_run:
            rows = cur.execute(query("retention_broadcast_rows"), {"broadcast_id": broadcast_id}).fetchone()
            return Pruned(campaign_id, campaign["name"], broadcast_id, dict(rows))
        counts = cur.execute(query("broadcast_counts"), {"broadcast_id": broadcast_id}).fetchone()
        pruned_at = cur.execute(query("retention_freeze"), {"campaign_id": campaign_id,
                                                            "counts": Jsonb(_plain(counts))}).fetchone()["pruned_at"]
        rows = cur.execute(query("retention_remove_broadcast"), {"broadcast_id": broadcast_id}).fetchone()
    return Pruned(campaign_id, campaign["name"], broadcast_id, dict(rows), pruned_at)


def prune_due(conn: psycopg.Connection, retention: RetentionSettings, *, dry_run: bool = False) -> PruneReport:
    """Everything the retention says is due now: each ended broadcast older than
    ``retention.broadcasts`` (skipping, for a later run, one that cannot go yet), then inbound mail
    records and status history by age."""
    report = PruneReport(dry_run=dry_run)
    if retention.broadcasts is not None:
        due = [row[0] for row in conn.execute(query("retention_due_broadcasts"), {"keep": retention.broadcasts})]
        for campaign_id in due:
            try:
                report.pruned.append(prune_campaign(conn, campaign_id, dry_run=dry_run))
            except (InvalidState, NotFound) as exc:  # sends in flight, a concurrent prune or delete
                report.skipped.append(Skipped(campaign_id, str(exc)))
    by_age = (("inbound_mail", retention.inbound_mail, query("retention_count_inbound_mail"),
               query("retention_expire_inbound_mail")),
              ("campaign_events", retention.campaign_events, query("retention_count_campaign_events"),
               query("retention_expire_campaign_events")))
    for table, keep, count, expire in by_age:
        if keep is not None:
            with conn.transaction():
                report.expired[table] = conn.execute(count if dry_run else expire, {"keep": keep}).fetchone()[0]
    return report


def _plain(counts: dict[str, Any]) -> dict[str, Any]:
    """The counts as JSON keeps them (numbers from numeric sums as ints)."""
    return {key: int(value) if not isinstance(value, (dict, list, str)) and value is not None else value
            for key, value in counts.items()}
