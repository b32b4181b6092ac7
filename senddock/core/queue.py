"""The queue layer: every read and write of broadcast_jobs the engine makes, one method per query."""

from __future__ import annotations

import uuid
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
import structlog
from psycopg.rows import class_row, dict_row

from senddock.config import BreakerSettings
from senddock.core.nodes import LOCK_CLASS, NodeIdentity
from senddock.core.queries import query
from senddock.pacing.rates import Rate, parse_campaign_rate

log = structlog.get_logger()


@dataclass(frozen=True)
class ClaimedJob:
    id: int
    broadcast_id: int
    campaign_id: int
    subscriber_id: int
    email: str
    name: str
    attributes: dict[str, Any]
    attempts: int
    deferrals: int  # retries that did not use up the recipient's retries (throttling, relay trouble)
    claim_token: uuid.UUID | None
    age: float  # seconds since its first attempt, on the database's clock (0 before any)
    suppressed: bool


@dataclass(frozen=True)
class JobResult:
    """What the worker commits for one send."""

    status: str  # the job's new status: sent, retry, failed, or pending/retry when put back (pause)
    outcome: str  # for the delivery log: sent, retry, bounce, fail, pause
    counts: bool  # whether this attempt counts against the recipient
    delay: float | None = None
    failure_reason: str | None = None
    last_result: str = ""
    in_doubt: bool = False
    phase: str | None = None
    code: int | None = None
    enhanced_code: str | None = None
    provider_message_id: str | None = None
    ok: bool = False  # the transport reported the message accepted
    bounce: bool = False
    deferred: bool = False  # a retry that does not use up the recipient's retries


@dataclass(frozen=True)
class Recorded:
    recorded: bool  # False: the claim was lost, the job's state was not ours to change
    late_sent: bool  # the claim was lost but the delivered message was marked sent
    next_ours: bool  # the batch's next job is still claimed by us (False: its claim was lost)
    next_campaign_status: str | None
    batch_released: bool = False  # the rest of the batch was put back (after a reconnect)


@dataclass(frozen=True)
class RecoveredJob:
    id: int
    broadcast_id: int
    email: str
    status: str
    failure_reason: str | None
    in_doubt: bool
    dead_node: str | None


class Queue:
    """SQL of the engine on one connection (autocommit: each method is one short transaction)."""

    def __init__(self, conn: psycopg.Connection, node: NodeIdentity, *, result_commit: str = "async") -> None:
        self.conn = conn
        self.node = node
        self._synchronous_commit = "off" if result_commit == "async" else "on"

    def claim(self, limit: int, token: uuid.UUID | None = None) -> list[ClaimedJob]:
        params = {"limit": limit, "node_id": self.node.id, "claim_token": token or uuid.uuid4(),
                  "async_results": self._synchronous_commit == "off"}
        with self.conn.cursor(row_factory=class_row(ClaimedJob)) as cur:
            jobs = cur.execute(query("jobs_claim"), params).fetchall()
        return sorted(jobs, key=lambda j: j.id)

    def record(
        self,
        job: ClaimedJob,
        attempt: int,
        started_at: datetime | None,
        result: JobResult,
        next_job: ClaimedJob | None,
        *,
        synchronous: bool = False,
    ) -> Recorded:
        """Commit one send's result (``synchronous``: wait for the disk whatever result_commit says)."""
        params = {
            "job_id": job.id,
            "claim_token": job.claim_token,
            "broadcast_id": job.broadcast_id,
            "attempt": attempt,
            "status": result.status,
            "counts": int(result.counts),
            "deferred": int(result.deferred),
            "delay": result.delay,
            "failure_reason": result.failure_reason,
            # Servers' text goes into text columns: a NUL byte would make the whole commit fail.
            "last_result": result.last_result[:2000].replace("\x00", ""),
            "provider_message_id": result.provider_message_id,
            "node": self.node.name,
            "node_id": self.node.id,
            "started_at": started_at,
            "outcome": result.outcome,
            "in_doubt": result.in_doubt,
            "ok": result.ok,
            "phase": result.phase,
            "code": result.code,
            "enhanced_code": result.enhanced_code,
            "next_job_id": next_job.id if next_job else None,
            "next_claim_token": next_job.claim_token if next_job else None,
            "next_campaign_id": next_job.campaign_id if next_job else None,
            "synchronous_commit": "on" if synchronous else self._synchronous_commit,
        }
        if result.bounce:
            # The pending hooks row commits with the bounce, so a crash cannot lose the suppression.
            with self.conn.transaction():
                recorded, next_status, _ = self.conn.execute(query("job_record_result"), params).fetchone()
                self.conn.execute(query("job_record_bounce"), {
                    "job_id": job.id, "broadcast_id": job.broadcast_id, "campaign_id": job.campaign_id,
                    "email": job.email, "code": result.code, "enhanced_code": result.enhanced_code,
                    "diagnostic": params["last_result"], "node_id": self.node.id})
        else:
            recorded, next_status, _ = self.conn.execute(query("job_record_result"), params).fetchone()
        late_sent = False
        if not recorded and result.ok:
            late_sent = self.late_success(job, result)
        return Recorded(recorded, late_sent, next_status is not None, next_status)

    def late_success(self, job: ClaimedJob, result: JobResult) -> bool:
        """A delivery under a lost claim: mark the job sent unless someone sent it since."""
        params = {"job_id": job.id, "last_result": result.last_result[:2000].replace("\x00", ""),
                  "provider_message_id": result.provider_message_id}
        return self.conn.execute(query("job_record_late_success"), params).fetchone() is not None

    def result_recorded(self, job: ClaimedJob, started_at: datetime | None) -> bool | None:
        """Whether this node already committed the result of this send of ``job`` (checked after a
        reconnect: a commit's reply was lost, or a crash may have lost the commit): None when it
        did not, else whether it was recorded under a lost claim."""
        params = {"job_id": job.id, "node_id": self.node.id, "started_at": started_at}
        row = self.conn.execute(query("job_result_recorded"), params).fetchone()
        return None if row is None else row[0]

    def release(self, jobs: Sequence[ClaimedJob]) -> int:
        if not jobs:
            return 0
        rows = self.conn.execute(
            query("jobs_release"),
            {"job_ids": [j.id for j in jobs], "claim_tokens": [j.claim_token for j in jobs]},
        ).fetchall()
        return len(rows)

    def release_claim(self, token: uuid.UUID) -> int:
        """Put back what is left of a batch none of whose sends began (its claim may not even
        have committed: the connection broke first)."""
        rows = self.conn.execute(query("jobs_release_claim"), {"node_id": self.node.id, "claim_token": token}).fetchall()
        return len(rows)

    def recover(
        self,
        *,
        lease: float,
        in_doubt: str,
        max_rescues: int,
        dead_nodes: bool = True,
        orphans_of: Sequence[uuid.UUID] | None = None,
    ) -> list[RecoveredJob]:
        """Return to the queue the jobs of dead incarnations and, when ``orphans_of`` is given (the
        claim tokens this node's workers hold), this node's own jobs that no worker holds."""
        params = {
            "node_id": self.node.id,
            "name": self.node.name,
            "lease": lease,
            "in_doubt": in_doubt,
            "max_rescues": max_rescues,
            "lock_class": LOCK_CLASS,
            "dead_nodes": dead_nodes,
            "orphans": orphans_of is not None,
            "held_tokens": list(orphans_of or ()),
        }
        with self.conn.cursor(row_factory=class_row(RecoveredJob)) as cur:
            return cur.execute(query("jobs_recover"), params).fetchall()

    def raise_claim_floors(self) -> list[int]:
        """Move the claim floor of every sending broadcast (and of any with put-backs) that this node
        can take (another node's poll may hold one) to its lowest pending job; returns the
        broadcasts whose floor moved.

        Two statements in one READ COMMITTED transaction: the raise must see everything committed
        before it took the rows, so its snapshot is taken after the lock (see claim_floors_raise).
        """
        with self.conn.transaction():
            self.conn.execute("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
            taken = [row[0] for row in self.conn.execute(query("claim_floors_lock"))]
            if not taken:
                return []
            return [row[0] for row in self.conn.execute(query("claim_floors_raise"), {"broadcast_ids": taken})]

    def pause_campaign(self, campaign_id: int, reason: str, *, auto_resume: bool = False, probe_in: float = 0.0) -> bool:
        params = {"campaign_id": campaign_id, "reason": reason, "auto_resume": auto_resume, "probe_in": probe_in}
        return self.conn.execute(query("campaign_pause"), params).fetchone() is not None

    def bounce_check(self, campaign_id: int, broadcast_id: int, breaker: BreakerSettings) -> tuple[bool, bool]:
        """The bounce-rate breaker after a bounce: (tripped now, the campaign's bounces are held)."""
        params = {"campaign_id": campaign_id, "broadcast_id": broadcast_id, "rate": breaker.bounce_rate,
                  "window": breaker.bounce_window, "early_bounces": breaker.early_bounces,
                  "early_window": breaker.early_window}
        return self.conn.execute(query("campaign_bounce_check"), params).fetchone()

    def probe_due(self, interval: float, max_interval: float) -> tuple[int, int, str] | None:
        """A campaign paused for relay trouble whose probe is due: (id, probes so far, reason)."""
        params = {"interval": interval, "max_interval": max_interval}
        return self.conn.execute(query("campaign_probe_due"), params).fetchone()

    def probe_failed(self, campaign_id: int, result: str) -> None:
        self.conn.execute(query("campaign_probe_failed"), {"campaign_id": campaign_id, "result": result})

    def auto_resume(self, campaign_id: int, result: str) -> bool:
        with self.conn.transaction():
            row = self.conn.execute(query("campaign_auto_resume"), {"campaign_id": campaign_id, "result": result}).fetchone()
            if row is not None:
                self.conn.execute(query("notify_jobs"), {"broadcast_id": row[0]})
        return row is not None

    def finish_campaigns(self, broadcast_id: int | None = None) -> list[tuple[int, int]]:
        with self.conn.transaction():
            finished = self.conn.execute(query("campaigns_finish"), {"broadcast_id": broadcast_id}).fetchall()
            if finished:
                self.conn.execute(query("broadcasts_finished_mark"), {"broadcast_ids": [b for _, b in finished]})
        return finished

    def start_scheduled(self) -> list[tuple[int, int]]:
        """Scheduled campaigns whose time has come start sending: (campaign id, broadcast id)."""
        return self.conn.execute(query("campaigns_start_scheduled")).fetchall()

    def cancel_leftovers(self) -> int:
        """Fail the jobs workers put back after their campaign was cancelled."""
        return len(self.conn.execute(query("campaign_cancel_leftovers")).fetchall())

    def due_work_exists(self) -> bool:
        return self.conn.execute(query("due_work_exists")).fetchone()[0]

    def pending_bounces(self, lease: float) -> list[dict[str, Any]]:
        with self.conn.cursor(row_factory=dict_row) as cur:
            return cur.execute(query("bounces_pending"), {"node_id": self.node.id, "lease": lease}).fetchall()

    def bounce_done(self, job_id: int) -> None:
        self.conn.execute(query("bounce_done"), {"job_id": job_id})

    def bounce_hold(self, job_id: int) -> None:
        self.conn.execute(query("bounce_hold"), {"job_id": job_id})

    def bounce_retry_later(self, job_id: int) -> None:
        self.conn.execute(query("bounce_retry_later"), {"job_id": job_id})

    def campaign_content(self, campaign_id: int) -> dict[str, Any] | None:
        with self.conn.cursor(row_factory=dict_row) as cur:
            return cur.execute(query("campaign_content"), {"campaign_id": campaign_id}).fetchone()

    def campaign_rates(self, campaign_ids: Collection[int]) -> dict[int, Rate]:
        """The rates of their own of those campaigns, for their `campaign:ID` limits (those without
        one are absent). Read afresh with every claim, never cached with the content: `campaign
        set-rate` applies on every node from its next claim. A rate that cannot be read (written
        into the table by hand) is logged and left out: it must not stop the node, and the config's
        limits still hold."""
        rates: dict[int, Rate] = {}
        if not campaign_ids:
            return rates  # a claim that took nothing: no statement
        for campaign_id, stored in self.conn.execute(query("campaign_rates"), {"campaign_ids": list(campaign_ids)}):
            try:
                rates[campaign_id] = parse_campaign_rate(stored)
            except ValueError as exc:
                log.warning("campaign_rate_unreadable", campaign_id=campaign_id, error=str(exc))
        return rates
