"""The queue layer: every read and write of broadcast_jobs the engine makes, one method per query."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import class_row, dict_row

from senddock.config import BreakerSettings
from senddock.store.node_identity import LOCK_CLASS, NodeIdentity
from senddock.store.queries import for_broadcasts, query
from senddock.store import outbox
from senddock.config.webhooks import NO_WEBHOOKS, Subscriptions

# pg_advisory_xact_lock(class, key) class of a domain group's concurrency room (0x5E4D: node locks).
CONCURRENCY_LOCK_CLASS = 0x5E4F
# Seconds a claim goes on naming the broadcasts it read (jobs_claim_broadcasts) before it reads them
# again: reading them before every claim cost a round trip, a sixth of a claim of five. A claim
# that comes back short reads them at once (a campaign started or resumed: its NOTIFY woke the
# claimer); one that is full leaves a new broadcast's jobs for a second at most (the claim takes the
# oldest broadcast's first anyway). A campaign paused since is left out by the claim itself.
SENDING_KEPT = 1.0



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
    domain: str = ""
    send_rate: str | None = None  # the campaign's own rate, if it has one
    send_begun: bool | None = None  # marked begun by the claim (None: a claim without marks)
    claim_epoch: uuid.UUID | None = None  # the server epoch the claim committed in (async results only)


@dataclass(frozen=True)
class JobResult:
    """What the completer commits for one send."""

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
    paused_now: bool = False  # its pause outcome paused the campaign (once per campaign and commit)


@dataclass(frozen=True)
class GroupCommit:
    """What one group commit did: each result (by job id), which jobs it marked begun, and which of
    the results' campaigns no longer send (paused or cancelled, by anyone)."""

    recorded: dict[int, Recorded]
    begun: frozenset[int]
    stopped: frozenset[int] = frozenset()


@dataclass(frozen=True)
class ResultRow:
    """One send's result for the completer's group commit."""

    job: ClaimedJob
    attempt: int
    started_at: datetime | None  # with the node, it identifies the attempt row (None: never begun)
    result: JobResult
    pause_reason: str | None = None  # a pause outcome's reason: the campaign pauses in the same commit


@dataclass(frozen=True)
class RecoveredJob:
    id: int
    broadcast_id: int
    email: str
    status: str
    failure_reason: str | None
    in_doubt: bool
    dead_node: str | None


def _result_fields(row: ResultRow, tokens: dict[uuid.UUID, str]) -> dict[str, Any]:
    """One job's element of jobs_record_results' JSON parameter (names as its recordset declares);
    ``tokens``: claim tokens as text, written once per claim rather than once per job."""
    result = row.result
    token = tokens.get(row.job.claim_token)
    if token is None:
        token = tokens[row.job.claim_token] = str(row.job.claim_token)
    return {
        "job_id": row.job.id, "claim_token": token, "broadcast_id": row.job.broadcast_id,
        "campaign_id": row.job.campaign_id, "email": row.job.email, "attempt": row.attempt,
        "status": result.status, "counts": int(result.counts), "deferred": int(result.deferred),
        "delay": result.delay, "failure_reason": result.failure_reason,
        # Servers' text goes into text columns: a NUL byte would make the whole commit fail.
        "last_result": result.last_result[:2000].replace("\x00", ""),
        "provider_message_id": result.provider_message_id,
        "started_at": row.started_at.isoformat() if row.started_at is not None else None,
        "outcome": result.outcome, "in_doubt": result.in_doubt, "ok": result.ok, "phase": result.phase,
        "code": result.code, "enhanced_code": result.enhanced_code, "bounce": result.bounce,
        "pause_reason": row.pause_reason if result.outcome == "pause" else None,
    }


def _broadcasts(*jobs: Iterable[ClaimedJob]) -> tuple[int, ...]:
    """The broadcasts of these jobs, in order: what a statement by job id names (for_broadcasts)."""
    return tuple(sorted({job.broadcast_id for group in jobs for job in group}))


def cancel_leftovers(conn: psycopg.Connection) -> int:
    """Fail the jobs put back after their campaign was cancelled (a released claim, a recovery);
    how many. Every poll asks; the tallies answer, and only a broadcast with some is touched."""
    broadcasts = tuple(row[0] for row in conn.execute(query("campaign_cancel_leftovers_broadcasts")))
    if not broadcasts:
        return 0
    return len(conn.execute(for_broadcasts("campaign_cancel_leftovers", broadcasts)).fetchall())


class JobQueue:
    """SQL of the engine on one connection (autocommit: each method is one short transaction)."""

    def __init__(self, conn: psycopg.Connection, node: NodeIdentity, *, result_commit: str = "async",
                 webhooks: Subscriptions = NO_WEBHOOKS, lease: float = 30.0) -> None:
        self.conn = conn
        self.node = node
        self._synchronous_commit = "off" if result_commit == "async" else "on"
        self._lease = lease  # recovery.lease: who counts as live (claims wait for live nodes to settle)
        # The events webhooks subscribed to are written in the transaction of their facts.
        self.webhooks = webhooks
        # The broadcasts sending, as the last claim read them (see SENDING_KEPT), and when.
        self._sending: tuple[int, ...] | None = None
        self._sending_read = 0.0

    def claim(self, limit: int, token: uuid.UUID | None = None, *, begun: bool | None = None) -> list[ClaimedJob]:
        """Claim up to ``limit`` due jobs under one token, committed synchronously.

        ``begun``: True marks every job begun in the claim itself (each goes straight to a sender),
        except those of a campaign with its own rate; False marks none (a limit is taken first,
        then ``begin``); None leaves the mark out (the caller sends the batch one at a time in id
        order, which says what began).
        """
        token = token or uuid.uuid4()
        known = self._sending is not None and time.monotonic() - self._sending_read < SENDING_KEPT
        if not known:
            self._read_sending()
        jobs = self._claim(limit, token, begun)
        if len(jobs) < limit and known:
            # Short: a campaign may have started or resumed since the broadcasts were read. Read
            # them again, and claim the rest from them if they changed (under the same token).
            kept = self._sending
            if self._read_sending() != kept:
                jobs += self._claim(limit - len(jobs), token, begun)
        return sorted(jobs, key=lambda j: j.id)

    def _read_sending(self) -> tuple[int, ...]:
        self._sending, self._sending_read = self.sending_broadcasts(), time.monotonic()
        return self._sending

    def _claim(self, limit: int, token: uuid.UUID, begun: bool | None) -> list[ClaimedJob]:
        if not self._sending:  # nothing sends: no claim to plan
            return []
        params = {"limit": limit, "node_id": self.node.id, "claim_token": token,
                  "async_results": self._synchronous_commit == "off", "begun": begun, "lease": self._lease}
        with self.conn.cursor(row_factory=class_row(ClaimedJob)) as cur:
            return cur.execute(for_broadcasts("jobs_claim", self._sending), params).fetchall()

    def begin(self, token: uuid.UUID, begun: Sequence[ClaimedJob],
              held: Sequence[tuple[ClaimedJob, datetime]]) -> set[int]:
        """Mark ``begun`` as begun (synchronously: their sends start after this returns) and put
        ``held`` back as retries due at the given times, no attempt spent. Returns the ids marked
        (a job whose claim was lost meanwhile is not)."""
        params = {"claim_token": token, "begun_ids": [j.id for j in begun],
                  "held_ids": [j.id for j, _ in held], "held_due": [due for _, due in held]}
        statement = for_broadcasts("jobs_begin", _broadcasts(begun, (j for j, _ in held)))
        marked, _, _ = self.conn.execute(statement, params).fetchone()
        return set(marked or ())

    def record_results(self, rows: Sequence[ResultRow], *, synchronous: bool = False) -> dict[int, Recorded]:
        """Commit many sends' results in one statement (``synchronous``: wait for the disk whatever
        result_commit says). Returns what each job's result did, by job id."""
        return self.commit_group(rows, synchronous=synchronous).recorded

    def commit_group(self, rows: Sequence[ResultRow], *, synchronous: bool = False,
                     begin: Sequence[ClaimedJob] = ()) -> GroupCommit:
        """The completer's commit: ``rows``' results and, in the same statement, the begin marks of
        ``begin`` (jobs claimed ahead, not begun: the commit is synchronous then, since their sends
        start once it returns)."""
        if not rows:
            return GroupCommit({}, frozenset())
        tokens: dict[uuid.UUID, str] = {}
        params = {
            "results": json.dumps([_result_fields(r, tokens) for r in rows]),
            "count": len(rows),
            "begin_ids": [j.id for j in begin],
            "begin_tokens": [j.claim_token for j in begin],
            "node": self.node.name,
            "node_id": self.node.id,
            "sync": "on" if synchronous or begin else self._synchronous_commit,
        }
        statement = for_broadcasts("jobs_record_results", _broadcasts((r.job for r in rows), begin))
        if not self.webhooks.active:  # no webhooks: the one statement as ever, nothing more
            return self._committed(statement, params)
        # The statement's synchronous_commit setting holds for the transaction it is in.
        # Pipelined: BEGIN goes with the results' statement, the events' INSERT with COMMIT (two
        # round trips, not four).
        with self.conn.pipeline(), self.conn.transaction():
            committed = self._committed(statement, params)
            outbox.emit(self.conn, self.webhooks, result_events(rows, committed.recorded))
        return committed

    def _committed(self, statement: str, params: dict[str, Any]) -> GroupCommit:
        recorded, begun, stopped = {}, frozenset(), frozenset()
        for job_id, applied, late_sent, paused_now, marked, halted, _ in self.conn.execute(statement, params):
            recorded[job_id] = Recorded(applied, late_sent, paused_now)
            begun, stopped = frozenset(marked or ()), frozenset(halted or ())
        return GroupCommit(recorded, begun, stopped)

    def record(self, job: ClaimedJob, attempt: int, started_at: datetime | None, result: JobResult, *,
               synchronous: bool = False) -> Recorded:
        """Commit one send's result (see ``record_results``)."""
        return self.record_results([ResultRow(job, attempt, started_at, result)], synchronous=synchronous)[job.id]

    def results_recorded(self, rows: Sequence[ResultRow]) -> dict[int, bool]:
        """Which of these results this node already committed (checked after a lost connection
        or a loss of WAL): job id -> whether it was recorded under a lost claim."""
        params = {"job_ids": [r.job.id for r in rows], "started_ats": [r.started_at for r in rows],
                  "node_id": self.node.id}
        statement = for_broadcasts("jobs_results_recorded", _broadcasts(r.job for r in rows))
        return dict(self.conn.execute(statement, params).fetchall())

    def reclaim(self, jobs: Sequence[ClaimedJob]) -> set[int]:
        """After a loss of WAL: take back this node's jobs in flight under their claims, marked
        begun, where the server lost the claim or the mark (see senddock.core.journal). Returns the
        ids taken back."""
        if not jobs:
            return set()
        params = {"job_ids": [j.id for j in jobs], "tokens": [j.claim_token for j in jobs],
                  "node_id": self.node.id, "async_results": self._synchronous_commit == "off"}
        taken, _ = self.conn.execute(for_broadcasts("jobs_reclaim", _broadcasts(jobs)), params).fetchone()
        return set(taken or ())

    def settled(self, epoch: uuid.UUID) -> bool:
        """This node has re-applied what it remembers in ``epoch``: claims no longer wait for it.
        False when ``epoch`` is no longer the server's (settle again in the new one)."""
        return self.conn.execute(query("node_settled"), {"node_id": self.node.id, "epoch": epoch}).fetchone() is not None

    def unsettled_nodes(self) -> list[tuple[str, str, int, float | None]]:
        """Live nodes every claim waits for: (name, host, pid, seconds since the epoch began)."""
        return self.conn.execute(query("nodes_unsettled"), {"lease": self._lease}).fetchall()

    def replication_lag(self) -> float | None:
        """Seconds of WAL the server's standbys have not flushed (None: no standby it may read)."""
        return self.conn.execute(query("replication_lag")).fetchone()[0]

    def in_flight_by_domain(self) -> dict[str, int]:
        """Sends in flight in the whole cluster, by recipient domain."""
        return dict(self.conn.execute(for_broadcasts("jobs_in_flight_by_domain", self.open_broadcasts())).fetchall())

    def lock_concurrency(self, keys: Sequence[str]) -> None:
        """Inside a transaction: serialize with every node counting the same groups' room."""
        self.conn.execute(query("concurrency_locks"), {"keys": list(keys), "lock_class": CONCURRENCY_LOCK_CLASS})

    def release(self, jobs: Sequence[ClaimedJob]) -> int:
        if not jobs:
            return 0
        rows = self.conn.execute(
            for_broadcasts("jobs_release", _broadcasts(jobs)),
            {"job_ids": [j.id for j in jobs], "claim_tokens": [j.claim_token for j in jobs]},
        ).fetchall()
        return len(rows)

    def release_claim(self, token: uuid.UUID) -> int:
        """Put back what is left of a batch none of whose sends began (its claim may not even
        have committed: the connection broke first)."""
        statement = for_broadcasts("jobs_release_claim", self.open_broadcasts())
        rows = self.conn.execute(statement, {"node_id": self.node.id, "claim_token": token}).fetchall()
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
        claim tokens this node holds), this node's own jobs whose claims it no longer holds."""
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
        statement = for_broadcasts("jobs_recover", self.open_broadcasts())
        with self.conn.cursor(row_factory=class_row(RecoveredJob)) as cur:
            return cur.execute(statement, params).fetchall()

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
            statement = for_broadcasts("claim_floors_raise", tuple(taken))
            return [row[0] for row in self.conn.execute(statement, {"broadcast_ids": taken})]

    def pause_campaign(self, campaign_id: int, reason: str, *, auto_resume: bool = False, probe_in: float = 0.0) -> bool:
        params = {"campaign_id": campaign_id, "reason": reason, "auto_resume": auto_resume, "probe_in": probe_in}
        with self.conn.transaction():
            paused = self.conn.execute(query("campaign_pause"), params).fetchone() is not None
            if paused:
                outbox.emit(self.conn, self.webhooks, [outbox.event(
                    "campaign_paused", campaign_id=campaign_id, reason=reason, auto_resume=auto_resume)])
        return paused

    def bounce_check(self, campaign_id: int, broadcast_id: int, breaker: BreakerSettings) -> tuple[bool, bool]:
        """The bounce-rate breaker after a bounce: (tripped now, the campaign's bounces are held)."""
        return bounce_check(self.conn, self.webhooks, campaign_id, broadcast_id, breaker)

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
        """Finish the campaign of ``broadcast_id`` (None: of every broadcast sending) if none of its
        jobs is left to send."""
        broadcasts = (broadcast_id,) if broadcast_id is not None else self.sending_broadcasts()
        with self.conn.transaction():
            finished = self.conn.execute(for_broadcasts("campaigns_finish", broadcasts)).fetchall()
            if finished:
                self.conn.execute(query("broadcasts_finished_mark"), {"broadcast_ids": [b for _, b in finished]})
                outbox.emit(self.conn, self.webhooks, [
                    outbox.event("campaign_finished", campaign_id=c, broadcast_id=b) for c, b in finished])
        return finished

    def start_scheduled(self) -> list[tuple[int, int]]:
        """Scheduled campaigns whose time has come start sending: (campaign id, broadcast id)."""
        return self.conn.execute(query("campaigns_start_scheduled")).fetchall()

    def cancel_leftovers(self) -> int:
        """Fail the jobs put back after their campaign was cancelled."""
        return cancel_leftovers(self.conn)

    def fold_tallies(self) -> int:
        """Fold the tallies of ended sessions into one row per key (migration 11); how many rows went."""
        with self.conn.transaction():
            folded = self.conn.execute(query("tallies_fold")).fetchone()[0]
            self.conn.execute(query("tallies_drop_empty"))
        return folded

    def due_work_exists(self) -> bool:
        return self.conn.execute(for_broadcasts("due_work_exists", self.sending_broadcasts())).fetchone()[0]

    def open_broadcasts(self) -> tuple[int, ...]:
        """The broadcasts whose campaigns have not finished: the only ones with jobs 'sending'."""
        return tuple(row[0] for row in self.conn.execute(query("jobs_open_broadcasts")))

    def sending_broadcasts(self) -> tuple[int, ...]:
        """The broadcasts of the campaigns sending now: what the claim and the poll's statements name."""
        return tuple(row[0] for row in self.conn.execute(query("jobs_claim_broadcasts")))

    def webhooks_due(self, endpoints: Sequence[str]) -> bool:
        """Webhook events of these endpoints due now (delivered by the node before it goes idle)."""
        return self.conn.execute(query("webhook_due_exists"), {"endpoints": list(endpoints)}).fetchone()[0]

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


def result_events(rows: Sequence[ResultRow], recorded: dict[int, Recorded]) -> list[dict[str, Any]]:
    """The webhook events a group of results makes: each message sent (a delivery under a lost
    claim too: it went out), each bounce at the send, each campaign a pause outcome paused."""
    events = []
    for row in rows:
        done, job, result = recorded[row.job.id], row.job, row.result
        ids = {"campaign_id": job.campaign_id, "broadcast_id": job.broadcast_id, "job_id": job.id, "email": job.email}
        if (done.recorded and result.status == "sent") or done.late_sent:
            events.append(outbox.event("sent", **ids, attempt=row.attempt,
                                       provider_message_id=result.provider_message_id))
        elif done.recorded and result.outcome == "bounce":
            events.append(outbox.event("bounced", **ids, bounce_type="hard", source="send", code=result.code,
                                       enhanced_code=result.enhanced_code, diagnostic=result.last_result[:500]))
        if done.paused_now:
            events.append(outbox.event("campaign_paused", campaign_id=job.campaign_id, reason=row.pause_reason,
                                       auto_resume=False))
    return events


def bounce_check(conn: psycopg.Connection, webhooks: Subscriptions, campaign_id: int, broadcast_id: int,
                 breaker: BreakerSettings) -> tuple[bool, bool]:
    """The bounce-rate breaker after a bounce, at the send or later (see JobQueue.bounce_check); a
    trip writes its campaign_paused event in the same transaction."""
    params = {"campaign_id": campaign_id, "broadcast_id": broadcast_id, "rate": breaker.bounce_rate,
              "window": breaker.bounce_window, "early_bounces": breaker.early_bounces,
              "early_window": breaker.early_window}
    with conn.transaction():
        tripped, holding = conn.execute(query("campaign_bounce_check"), params).fetchone()
        if tripped:
            outbox.emit(conn, webhooks, [outbox.event("campaign_paused", campaign_id=campaign_id,
                                                      reason="bounce_rate", auto_resume=False)])
    return tripped, holding
