"""Retention: a broadcast's per-recipient rows go once it has ended long enough ago, its campaign
keeping the counts it had (``campaign status`` shows the same figures after), and old inbound mail
records and status history go by age. Suppressions, subscribers and unsubscribes are never pruned.

A campaign's counts are frozen, and its rows outside its partitions deleted, in one transaction;
then its broadcast's partitions (migration 20) are detached (CONCURRENTLY: nodes' claims and
commits never wait) and dropped, which gives their disk back at once with nothing left for VACUUM.
A process killed in between leaves a campaign pruned with its counts whose partitions the next
prune drops; killed before the commit, the campaign is whole.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql
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
    bytes_returned: int = 0  # its partitions' disk, given back (in a dry run: what would be)

    def as_dict(self) -> dict[str, Any]:
        return {"campaign_id": self.campaign_id, "name": self.name, "broadcast_id": self.broadcast_id,
                "rows": self.rows, "bytes_returned": self.bytes_returned}


@dataclass(frozen=True)
class Skipped:
    """A due campaign left for a later prune, and why."""

    campaign_id: int
    reason: str

    def as_dict(self) -> dict[str, Any]:
        return {"campaign_id": self.campaign_id, "reason": self.reason}


@dataclass
class PruneReport:
    dry_run: bool
    pruned: list[Pruned] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    expired: dict[str, int] = field(default_factory=dict)  # rows dropped by age, per table
    finished: int = 0  # disk of partitions an earlier, interrupted prune left, dropped now

    @property
    def bytes_returned(self) -> int:
        """Disk given back at once: the partitions dropped (rows deleted by age free theirs for reuse)."""
        return sum(p.bytes_returned for p in self.pruned) + self.finished

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
        rows = dict(cur.execute(query("retention_broadcast_rows"), {"broadcast_id": broadcast_id}).fetchone())
        if dry_run:
            held = sum(p["bytes"] for p in cur.execute(query("retention_partitions"), {"broadcast_id": broadcast_id}))
            return Pruned(campaign_id, campaign["name"], broadcast_id, rows, bytes_returned=held)
        counts = cur.execute(query("broadcast_counts"), {"broadcast_id": broadcast_id}).fetchone()
        pruned_at = cur.execute(query("retention_freeze"), {"campaign_id": campaign_id,
                                                            "counts": Jsonb(counts)}).fetchone()["pruned_at"]
        cur.execute(query("retention_remove_broadcast"), {"broadcast_id": broadcast_id})
    returned = drop_partitions(conn, broadcast_id)
    return Pruned(campaign_id, campaign["name"], broadcast_id, rows, pruned_at, returned)


def drop_partitions(conn: psycopg.Connection, broadcast_id: int) -> int:
    """Detach and drop the broadcast's partitions (of a campaign whose counts are frozen); the bytes
    they held. DETACH ... CONCURRENTLY waits for the transactions that may read them, blocking
    nobody; one interrupted half-way is finished (FINALIZE)."""
    with _autocommit(conn):  # DETACH CONCURRENTLY runs in transactions of its own
        partitions = conn.execute(query("retention_partitions"), {"broadcast_id": broadcast_id}).fetchall()
        for partition, parent, detaching, _ in partitions:
            if parent is not None:
                how = sql.SQL("FINALIZE" if detaching else "CONCURRENTLY")
                conn.execute(sql.SQL("ALTER TABLE {} DETACH PARTITION {} {}").format(
                    sql.Identifier(parent), sql.Identifier(partition), how))
            conn.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(partition)))
    return sum(row[3] for row in partitions)


@contextmanager
def _autocommit(conn: psycopg.Connection) -> Iterator[None]:
    was = conn.autocommit
    if not was:
        conn.rollback()  # nothing is open: the caller's transactions are committed blocks
        conn.autocommit = True
    try:
        yield
    finally:
        if not was:
            conn.autocommit = False


def prune_due(conn: psycopg.Connection, retention: RetentionSettings, *, dry_run: bool = False) -> PruneReport:
    """Everything the retention says is due now: each ended broadcast older than
    ``retention.broadcasts`` (skipping, for a later run, one that cannot go yet), then inbound mail
    records and status history by age."""
    report = PruneReport(dry_run=dry_run)
    if not dry_run:
        for _, broadcast_id in conn.execute(query("retention_pruned_with_partitions")).fetchall():
            report.finished += drop_partitions(conn, broadcast_id)  # an earlier prune stopped half-way
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
