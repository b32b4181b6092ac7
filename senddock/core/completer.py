"""The completer: records the results of many sends in one statement and one commit.

Senders hand each result over and go on to their next send; the completer collects what arrived
while its last commit ran (at a high concurrency, what arrives within a few more milliseconds too)
and commits it all at once (River's batch completer and pgqueuer's
buffered acknowledgements are the models). A send's slot is given back only once its result has
committed, so the jobs in doubt after a kill -9 (begun, not recorded) are never more than the
node's slots (twice its `concurrency` without pacing limits, see inflight.RUNWAY). The same
statement marks begun as many jobs of the deck (claimed ahead) as the group frees slots, and those
go to the senders in the freed slots: a slot is refilled without a claim on its way. Only after a
group of clean sends: a failure may trip a breaker, which must pause its campaign before anything
else of it begins (the claimer begins the deck's jobs then).

The completer records; what a result leads to belongs to others, told what each commit recorded
(as River's completer reports done jobs on a channel its producer subscribes to), each part named
in ``Wiring``: the aftercare (the breakers, pause outcomes and adaptive pacing, on the completer's
connection before the group's slots go back; log lines and bounce hooks after), the senders (the
deck's jobs a commit marked begun), the node (broadcasts with results: campaigns to finish).

With ``database.result_commit: async`` a commit does not wait for the disk: its results stay
*unsure* (a Postgres crash may lose them) until a later synchronous commit of this node (a claim,
a begin mark) has flushed the WAL past them, and their claims stay held meanwhile. When the server
lost WAL (the lifeline sees a new epoch) or a commit's reply never came, the completer asks the
database which of them it has and commits the others again, synchronously.
"""

from __future__ import annotations

import queue as queues
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

import psycopg
import structlog

from senddock.core.aftercare import Committed
from senddock.store.db import Database
from senddock.core.epoch import ensure_epoch
from senddock.core.inbox import Done, Inbox
from senddock.core.inflight import Deck, HeldClaims, Slots
from senddock.core.journal import Journal
from senddock.core.nodes import Lifeline
from senddock.store.jobs import ClaimedJob, JobQueue, Recorded, ResultRow
from senddock.core.waits import Waits
from senddock.errors import error_line

log = structlog.get_logger(__name__)

# Results per statement at most: a group commit this big already costs little per result.
MAX_GROUP = 500
# A group of deliveries waits up to LINGER for more results while waiting costs no sender its next
# job, so that a commit carries every sender's result rather than one or two. A node with fewer than
# LINGER_IN_FLIGHT slots waits while jobs marked begun wait for a sender (the runway, see
# inflight.RUNWAY: every sender has its next job, so no slot the commit would free is needed yet); a
# larger one while at least LINGER_IN_FLIGHT jobs are begun and not collected (a slow relay at a
# high concurrency, where results trickle in two or three per commit). Not the runway there: with
# instant sends, waiting for it to empty leaves the senders idle through every commit. Groups that
# large make the claimer stop using its deck (see claimer.MARK_COST). The wait never touches the
# in-doubt bound: the slots are the same. What each wait saved: docs/benchmarks.md.
LINGER = 0.010
LINGER_IN_FLIGHT = 64
# How long a settle waits for a claim whose reply has come to journal its jobs (microseconds,
# unless the claimer thread is descheduled).
BEGIN_WAIT = 1.0
# Seconds before a settle is tried again when the server did not take it (see _adopt).
SETTLE_RETRY = 0.5


class Runway(Protocol):
    """The senders, as the completer sees them (senders.Senders)."""

    def submit_claimed(self, jobs: list[tuple[ClaimedJob, float]]) -> None:
        """Jobs of the deck a commit marked begun, each with when its claim's reply arrived."""

    def waiting(self) -> int:
        """Jobs marked begun that no sender has taken yet."""


class Aftermath(Protocol):
    """Who acts on what a commit recorded (aftercare.Aftercare): told on the completer's thread, in
    this order, each step once it may no longer be put off."""

    def halt(self, campaign_ids: Iterable[int]) -> None:
        """Campaigns the commit found paused or cancelled elsewhere; before the deck's jobs it
        marked go to the senders."""

    def react(self, queue: JobQueue, results: list[Committed]) -> None:
        """The breakers, pause outcomes and pacing, on ``queue`` (the completer's connection),
        before the results' slots go back and their senders go on. Called again with the same
        results if the connection was lost meanwhile: each must be acted on once."""

    def put(self, results: list[Committed]) -> None:
        """The results once their slots and claims are back: log lines, counts, bounce hooks."""


class Node(Protocol):
    """The node the completer runs in (runner.Runner)."""

    def results_in(self, queue: JobQueue, broadcasts: set[int]) -> bool:
        """Results of ``broadcasts`` committed since this last returned True: finish the campaigns
        they may have finished (on ``queue``, the completer's connection) if no more of them is
        due, and say whether it did (False: told again, with the broadcasts of later results)."""


@dataclass(frozen=True)
class Wiring:
    """What a completer works with, each part named by what it is to the completer."""

    inbox: Inbox  # what the senders hand over
    slots: Slots  # a result's slot goes back once it has committed
    deck: Deck  # jobs claimed ahead: the commit that frees slots marks some begun for them
    claims: HeldClaims  # a claim is let go once its jobs' results are durable
    journal: Journal  # what this node began and recorded lately (see _server_lost_wal)
    waits: Waits  # commits in progress, for the watchdog
    lifeline: Lifeline  # the server epoch it last saw; whether this node may send (no refill if not)
    stopping: threading.Event  # the node is stopping: no refill
    senders: Runway  # where the deck's jobs marked begun go
    aftercare: Aftermath  # what each commit recorded, to act on
    node: Node  # told which broadcasts got results, to finish campaigns and see the node idle


class Completer(threading.Thread):
    def __init__(self, db: Database, queue_for_conn: Callable[[psycopg.Connection], JobQueue], wiring: Wiring, *,
                 async_results: bool = False) -> None:
        super().__init__(name="senddock-completer", daemon=True)
        self._db = db
        self._queue_for_conn = queue_for_conn
        self._parts = wiring
        self._inbox = wiring.inbox
        self._slots = wiring.slots
        self._claims = wiring.claims
        self._journal = wiring.journal
        self._waits = wiring.waits
        self._aftercare = wiring.aftercare
        self._waits_on_runway = wiring.slots.size < LINGER_IN_FLIGHT  # which wait a group makes (see LINGER)
        self._async = async_results
        self._retry = threading.Event()  # ends a wait to reconnect early (see database_back)
        self._lock = threading.Lock()
        # Commits so far; results committed asynchronously, with the commit that carried them.
        self._flushes = 0
        # (commit number, the server epoch it was committed in, the result)
        self._unsure: list[tuple[int, object, Committed]] = []
        self._failed: list[Done] = []  # a group whose commit's reply never came
        # A committed group whose aftermath (reactions, then slots, claims, aftercare) a lost
        # connection cut short: (group, its results as committed, unsure, kept), finished by _settle.
        self._unacted: tuple[list[Done], list[Committed], bool, int] | None = None
        self._failed_refill: list[ClaimedJob] = []  # the deck's jobs that commit was to mark begun
        self._touched: set[int] = set()  # broadcasts with results the node was not told of yet
        self._epoch = None  # the server epoch this node has settled in
        self._settle_again_at = 0.0  # monotonic: a settle the server did not take is tried again then
        self.group_size = 0.0  # results per commit, smoothed (read by the claimer: is a deck worth it)

    @property
    def pending(self) -> int:
        """Results handed over and not committed yet (read by the idle check)."""
        return self._inbox.pending

    # -- told by the claimer and the node -----------------------------------------------------

    @property
    def flushes(self) -> int:
        """Read before a synchronous commit: once it has committed, pass it to ``covered``."""
        with self._lock:
            return self._flushes

    def covered(self, flushes: int, epoch) -> None:
        """A synchronous commit in server epoch ``epoch`` that began after commit number ``flushes``
        returned: the WAL is on disk past it, so every result committed up to then *in the same
        epoch* is durable. One committed before a loss of WAL is not: a claim right after a crash
        must not vouch for it (the completer checks those, see _server_lost_wal)."""
        with self._lock:
            done = [c for seq, e, c in self._unsure if seq <= flushes and e == epoch]
            self._unsure = [(seq, e, c) for seq, e, c in self._unsure if not (seq <= flushes and e == epoch)]
        for item in done:
            self._claims.settle(item.row.job.claim_token)

    def database_back(self) -> None:
        """The lifeline reconnected: a wait to reconnect ends now (after a failover the sooner this
        node settles, the sooner every node claims again)."""
        self._retry.set()

    def close(self) -> None:
        """No more results will come (the senders have stopped)."""
        self._inbox.close()

    # -- the thread ----------------------------------------------------------------------------

    def run(self) -> None:
        backoff = 0.1
        while True:
            try:
                with self._db.connection() as conn:
                    queue = self._queue_for_conn(conn)
                    epoch = ensure_epoch(conn).id
                    self._settle(queue)
                    if self._epoch is None:
                        self._adopt(queue, epoch)  # a node's start: nothing to settle
                    elif epoch != self._epoch:
                        # The server lost WAL while this connection was down (the lifeline may
                        # have seen the new epoch first): check what it may have lost.
                        self._server_lost_wal(queue, epoch)
                    backoff = 0.1
                    if self._loop(queue):
                        self._let_go()
                        return
            except psycopg.OperationalError as exc:
                log.warning("completer_db_lost", error=error_line(exc), retry_in=backoff)
            except Exception:
                # Never a dead completer: a read-only server after a failover, bad bytes in a reply...
                log.exception("completer_error", retry_in=backoff)
            if self._inbox.closing.is_set() and backoff >= 5.0:
                # Shutting down and the database is gone: recovery takes what is left (in doubt).
                log.error("completer_gave_up", results=self.pending)
                self._let_go()
                return
            self._retry.wait(backoff)  # or at once when the lifeline is back (see database_back)
            self._retry.clear()
            backoff = min(backoff * 2, 5.0)

    def _loop(self, queue: JobQueue) -> bool:
        """Commit groups until closed and drained; True once done."""
        while True:
            group, closed = self._collect()
            if self._unsettled(self._parts.lifeline.epoch):
                self._server_lost_wal(queue, self._parts.lifeline.epoch)
            if group:
                self._commit(queue, group)
            if self._touched and self._parts.node.results_in(queue, self._touched):
                self._touched = set()
            if closed and not group:
                return True

    def _collect(self) -> tuple[list[Done], bool]:
        """Wait for a result, then take everything that has arrived (up to MAX_GROUP), and what
        arrives within LINGER while waiting costs no sender anything (see LINGER)."""
        group: list[Done] = []
        try:
            first = self._inbox.get(timeout=0.1)
        except queues.Empty:
            return group, self._inbox.drained()
        item: Done | None = first
        until = time.monotonic() + LINGER
        delivered = True  # every result in the group so far is a delivery
        while True:
            if item is not None and item.job is not None:
                group.append(item)
                delivered = delivered and item.row is not None and item.row.result.outcome == "sent"
            item = None
            if len(group) >= MAX_GROUP:
                break
            try:
                item = self._inbox.get()
                continue
            except queues.Empty:
                pass
            left = until - time.monotonic()
            if left <= 0 or not self._worth_waiting(len(group), delivered):
                break
            if self._waits_on_runway:
                if not self._inbox.wait_for_runway(left, self._parts.senders.waiting):
                    break  # a sender took the last waiting job meanwhile
                continue  # woken: take what arrived meanwhile and look again
            try:
                item = self._inbox.get(timeout=left)
            except queues.Empty:
                break
        return group, self._inbox.drained()

    def _worth_waiting(self, collected: int, delivered: bool) -> bool:
        """Whether to wait for more results before committing (see LINGER): never when stopping,
        nor for a group with anything but deliveries in it (a failure may trip a breaker, a pause
        outcome pauses its campaign: both must commit before more of the campaign begins)."""
        if not delivered or self._inbox.closing.is_set():
            return False
        if self._waits_on_runway:
            return self._parts.senders.waiting() > 0
        return self._slots.in_use - collected >= LINGER_IN_FLIGHT

    def _commit(self, queue: JobQueue, group: list[Done]) -> None:
        back = [d.job for d in group if d.row is None]
        results = [d for d in group if d.row is not None]
        refill = self._refill(results)
        self._failed, self._failed_refill = group, [job for job, _ in refill]
        if back:
            released = queue.release(back)
            self._journal.ended(back)
            log.info("jobs_put_back", jobs=released)
        with self._waits.watch("results", queue.conn):
            commit = queue.commit_group([d.row for d in results], begin=self._failed_refill)
        self._journal.recorded([d.row for d in results])
        self._failed, self._failed_refill = [], []
        # Paused or cancelled elsewhere (a person, another node): this node's next jobs of them,
        # marked begun already (inflight.RUNWAY), go back unsent from now on.
        self._aftercare.halt(commit.stopped)
        self.group_size += 0.2 * (len(results) - self.group_size)
        started = [(job, at) for job, at in refill if job.id in commit.begun]
        if started:
            self._journal.began(job for job, _ in started)
            self._parts.senders.submit_claimed(started)  # first: nothing below may strand a job marked begun
        # Until they are put back, a lost connection must not lose them (see _settle).
        self._failed_refill = [job for job, _ in refill if job.id not in commit.begun]
        # A commit that marked jobs begun was synchronous: its results are durable. Until acted on,
        # a lost connection must not lose the group's slots, claims and aftercare (see _settle).
        self._unacted = (group, _as_committed(results, commit.recorded), self._async and not refill, len(started))
        self._finish_unacted(queue)
        self._put_back(self._failed_refill, queue)
        self._failed_refill = []

    def _refill(self, results: list[Done]) -> list[tuple[ClaimedJob, float]]:
        """The deck's jobs to begin in the slots this group frees: after clean sends only (a
        failure may trip a breaker, which must pause first), never one with a campaign rate (the
        claimer takes it through the gate), none once the node stops or may not send."""
        if not results or any(d.row.result.outcome != "sent" for d in results) \
                or self._parts.stopping.is_set() or not self._parts.lifeline.may_send():
            return []
        return self._parts.deck.take(len(results), ready=lambda job: job.send_rate is None)

    def _put_back(self, jobs: list[ClaimedJob], queue: JobQueue) -> None:
        """The deck's jobs a commit did not mark begun (their campaign stopped sending, or their
        commit's fate is unknown: a release clears a mark that did commit)."""
        if jobs:
            released = queue.release(jobs)
            log.info("jobs_put_back", jobs=released)
            for job in jobs:
                self._claims.settle(job.claim_token)

    def _finish_unacted(self, queue: JobQueue) -> None:
        """The aftermath of the committed group in ``_unacted``; it stays there until this returns."""
        if self._unacted is not None:
            group, results, unsure, kept = self._unacted
            self._done(group, results, unsure, queue, kept)
            self._unacted = None

    def _done(self, group: list[Done], results: list[Committed], unsure: bool, queue: JobQueue, kept: int) -> None:
        """A group committed: see _act_on. Its senders waiting for the commit go on whatever
        happens (a connection lost mid-way must not park them until the node stops)."""
        try:
            self._act_on(group, results, unsure, queue, kept)
        finally:
            for done in group:
                if done.committed is not None:
                    done.committed.set()

    def _act_on(self, group: list[Done], results: list[Committed], unsure: bool, queue: JobQueue, kept: int) -> None:
        """The aftercare's reactions (breakers, pauses, pacing), then slots back (but the ``kept``
        ones the deck's jobs take over), claims settled (or held while unsure), aftercare fed."""
        self._aftercare.react(queue, results)
        with self._lock:
            self._flushes += 1
            seq = self._flushes
        self._inbox.committed(len(group))
        if len(group) > kept:
            self._slots.give(len(group) - kept)
        for done in group:
            if done.row is None:
                self._claims.settle(done.job.claim_token)
        for item in results:
            self._touched.add(item.row.job.broadcast_id)
            if unsure and item.recorded.recorded:
                with self._lock:
                    self._unsure.append((seq, self._epoch, item))
            else:
                self._claims.settle(item.row.job.claim_token)
        self._aftercare.put(results)

    # -- when a commit's fate is unknown ---------------------------------------------------------

    def _settle(self, queue: JobQueue) -> None:
        """On a new connection: finish the group whose commit's reply never came, or whose
        aftermath was cut short. Each stays until this succeeds: a connection lost again meanwhile
        must not lose it."""
        self._finish_unacted(queue)
        group = self._failed
        if group:
            back = [d.job for d in group if d.row is None]
            if back:
                queue.release(back)
                self._journal.ended(back)
            results = [d for d in group if d.row is not None]
            recorded, _ = self._commit_missing(queue, [d.row for d in results])
            self._journal.recorded([d.row for d in results])
        # The deck's jobs of that commit (or unmarked by one whose put-back failed): their marks,
        # if any committed, are cleared by the release.
        self._put_back(self._failed_refill, queue)
        self._failed, self._failed_refill = [], []
        if group:
            # Its aftermath stays until done, as a commit's does (the connection may be lost in it too).
            self._unacted = (group, _as_committed(results, recorded), False, 0)
            self._finish_unacted(queue)

    def _unsettled(self, epoch) -> bool:
        return epoch is not None and epoch != self._epoch and time.monotonic() >= self._settle_again_at

    def _server_lost_wal(self, queue: JobQueue, epoch) -> None:
        """A new server epoch (the lifeline saw it, or this completer reconnected into it): the
        server may have lost claims, begin marks and results of this node's, even where this
        connection never broke (a pooler in transaction mode keeps the client side of it open
        across a Postgres crash), and a promoted asynchronous standby may have lost them all.
        Settle before anyone claims again (see senddock.core.journal): the jobs in flight taken
        back under their claims, the results of the journal's window (and those committed
        asynchronously and not yet covered) committed again where missing, then this node marked
        settled in the epoch. They stay unsure, and the epoch the old one, until that succeeds:
        this connection may be the dead one."""
        in_flight, remembered = self._journal.snapshot(wait=BEGIN_WAIT)
        with self._lock:
            unsure = list(self._unsure)
        taken = queue.reclaim(in_flight)
        rows = _distinct([c.row for _, _, c in unsure] + remembered)
        if rows or taken:
            log.warning("server_epoch_changed", epoch=str(epoch), in_flight=len(in_flight), taken_back=len(taken),
                        results=len(rows))
        _, again = self._commit_missing(queue, rows)
        for _, _, item in unsure:
            if item.row.result.bounce and item.hooks_ran and item.row.job.id in again:
                queue.bounce_done(item.row.job.id)  # its pending hooks row came back with it: they ran
        if unsure:
            checked = {id(entry) for entry in unsure}
            with self._lock:
                self._unsure = [entry for entry in self._unsure if id(entry) not in checked]
            for _, _, item in unsure:
                self._claims.settle(item.row.job.claim_token)
        self._adopt(queue, epoch)

    def _adopt(self, queue: JobQueue, epoch) -> None:
        """``epoch`` is the one this node has settled in: claims no longer wait for it. Not yet if
        the server says otherwise (another loss of WAL since, or the node's row lost with the
        primary's last moments and not yet made again by the lifeline): tried again shortly."""
        if queue.settled(epoch):
            log.info("node_settled", epoch=str(epoch))
            self._epoch = epoch
        else:
            self._settle_again_at = time.monotonic() + SETTLE_RETRY

    def _commit_missing(self, queue: JobQueue, rows: list[ResultRow]) -> tuple[dict[int, Recorded], set[int]]:
        """Commit again, synchronously, the results the database does not have. Returns what each
        row's result did, and the jobs whose results were committed again."""
        if not rows:
            return {}, set()
        there: dict[int, bool] = {}
        again: dict[int, Recorded] = {}
        for start in range(0, len(rows), MAX_GROUP):  # a journal's window may hold thousands
            chunk = rows[start:start + MAX_GROUP]
            found = queue.results_recorded(chunk)
            missing = [r for r in chunk if r.job.id not in found]
            there.update(found)
            if missing:
                with self._waits.watch("results", queue.conn):
                    again.update(queue.record_results(missing, synchronous=True))
        missing = [r for r in rows if r.job.id in again]
        for row in missing:
            log.warning("result_committed_again", job_id=row.job.id, outcome=row.result.outcome,
                        claim_lost=not again[row.job.id].recorded)
        found = {job_id: Recorded(recorded=not claim_lost, late_sent=False) for job_id, claim_lost in there.items()}
        return {**found, **again}, set(again)

    def _let_go(self) -> None:
        """On the way out: results still unsure are left to the server (recovery marks their jobs
        in doubt if it lost them)."""
        with self._lock:
            unsure, self._unsure = self._unsure, []
        for _, _, item in unsure:
            self._claims.settle(item.row.job.claim_token)


def _as_committed(results: list[Done], recorded: dict[int, Recorded]) -> list[Committed]:
    """A group's results as its commit recorded them, for the aftercare."""
    return [Committed(d.row, d.verdict, recorded[d.job.id]) for d in results]  # type: ignore[arg-type]


def _distinct(rows: list[ResultRow]) -> list[ResultRow]:
    """The latest result of each job (the rows come in commit order): a result may be both unsure
    and in the journal, and a job retried within the window has several. One statement records one
    result per job, and the latest says what became of it."""
    return list({row.job.id: row for row in rows}.values())
