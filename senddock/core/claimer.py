"""The claimer: one per node, claims due jobs for the node's free send slots and its deck.

Each claim is one statement on the claimer's own connection, committed synchronously. Two kinds:

- for free slots (none refilled by the completer: at the start, after a lull): sized to them (at
  most ``claim_batch``). Without limits the claim marks every job begun itself; with limits the
  pacing gate decides which may begin (see pacing_gate). Then the jobs go to the senders.
- for the deck (without pacing limits): jobs claimed ahead and not marked begun, once the deck is
  down to half. The completer marks them begun in the commit that frees the slots they take, so
  a slot is refilled without waiting for a claim, and claims are large whatever the concurrency.
  A slot freed with jobs on the deck (the completer refills only after clean sends, and never a
  job with a campaign rate) is filled here from the deck, through the gate.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable

import psycopg
import structlog

from senddock.config import Config
from senddock.core.completer import Completer
from senddock.core.content import ContentCache
from senddock.store.db import Database
from senddock.core.epoch import ensure_epoch
from senddock.core.inflight import Deck, HeldClaims, Slots
from senddock.core.journal import Journal
from senddock.core.nodes import Lifeline
from senddock.core.pacing_gate import PacingGate
from senddock.store.jobs import ClaimedJob, JobQueue
from senddock.core.waits import Waits
from senddock.core.senders import Dispatch, Senders
from senddock.errors import error_line
from senddock.observe.node_metrics import NodeMetrics

log = structlog.get_logger(__name__)

# A job's begin mark riding on a group commit costs about a twentieth of a claim statement
# (measured on PostgreSQL 15, 2 cores: 60-90 us a job against 1.2-1.6 ms a statement, client and
# server). A deck trades a claim of k jobs (the k slots a group frees) for k marks plus its own
# claims, one per half deck: it pays while groups stay under 1 / (MARK_COST + 2 / deck size), about
# 11 results for a deck of 50 and 2 for a deck of 5. Groups that large come from sends that end
# together (an instant transport), which a claim of that size refills as cheaply.
MARK_COST = 0.05


class Claimer(threading.Thread):
    def __init__(
        self,
        config: Config,
        db: Database,
        queue_for_conn: Callable[[psycopg.Connection], JobQueue],
        *,
        slots: Slots,
        deck: Deck,
        claims: HeldClaims,
        contents: ContentCache,
        gate: PacingGate,
        senders: Senders,
        completer: Completer,
        lifeline: Lifeline,
        stopping: threading.Event,
        wait_for_work: Callable[[float], None],
        journal: Journal,
        waits: Waits,
        metrics: NodeMetrics | None = None,
    ) -> None:
        super().__init__(name="senddock-claimer", daemon=True)
        self._config = config
        self._db = db
        self._queue_for_conn = queue_for_conn
        self._slots = slots
        self._deck = deck
        self._claims = claims
        self._contents = contents
        self._gate = gate
        self._senders = senders
        self._completer = completer
        self._lifeline = lifeline
        self._journal = journal
        self._waits = waits  # claims in progress, for the watchdog
        self._stopping = stopping
        self._wait_for_work = wait_for_work
        self._claim_duration = (metrics or NodeMetrics()).claim_duration
        self._unanswered: uuid.UUID | None = None  # a claim whose reply never came
        self._retry = threading.Event()  # ends a wait to reconnect early (see wake)
        self._deck_retry_at = 0.0  # monotonic: a claim for the deck found too little; the next not before
        self.dry = False  # the last claim found fewer due jobs than it asked for
        self.busy = False

    def run(self) -> None:
        backoff = 0.1
        while not self._stopping.is_set():
            try:
                with self._db.connection() as conn:
                    queue = self._queue_for_conn(conn)
                    ensure_epoch(conn)
                    self._put_back_unanswered(queue)
                    backoff = 0.1
                    self._loop(queue)
            except psycopg.OperationalError as exc:
                log.warning("claimer_db_lost", error=error_line(exc), retry_in=backoff)
            except Exception:
                log.exception("claimer_error", retry_in=backoff)
            self.busy = False
            self._retry.wait(backoff)  # or at once when woken: the lifeline is back, or stopping
            self._retry.clear()
            backoff = min(backoff * 2, 5.0)
        if self._unanswered is not None:
            # Stopping with a claim whose reply never came: put it back on a fresh connection if
            # the database answers (none of its jobs reached a sender), else leave it to recovery.
            try:
                with self._db.connection() as conn:
                    self._put_back_unanswered(self._queue_for_conn(conn))
            except psycopg.Error as exc:
                log.warning("claim_left_to_recovery", error=error_line(exc))
                self._claims.let_go(self._unanswered)
        self._put_back_deck()

    def _put_back_deck(self) -> None:
        """Stopping: the jobs claimed ahead go back as they were (none began), or to recovery if
        the database is gone (unmarked: put back as they were there too)."""
        left = [job for job, _ in self._deck.take(len(self._deck))]
        if not left:
            return
        try:
            with self._db.connection() as conn:
                released = self._queue_for_conn(conn).release(left)
            log.info("jobs_put_back", jobs=released)
        except psycopg.Error as exc:
            log.warning("deck_left_to_recovery", jobs=len(left), error=error_line(exc))
        self._settle(left)

    def _settle(self, jobs: list[ClaimedJob]) -> None:
        for job in jobs:
            self._claims.settle(job.claim_token)

    def _put_back_unanswered(self, queue: JobQueue) -> None:
        """A claim (or its begin marks) whose reply never came: nothing of it reached a sender."""
        token, self._unanswered = self._unanswered, None
        if token is not None:
            released = queue.release_claim(token)
            if released:
                log.info("claim_put_back", jobs=released)
            self._claims.let_go(token)

    def _loop(self, queue: JobQueue) -> None:
        config = self._config
        marks_begun = not self._gate.configured
        while not self._stopping.is_set():
            if not self._lifeline.may_send():
                self._wait_for_work(config.poll_interval)  # self-fenced: no claims until the heartbeat is back
                continue
            free = self._slots.wait_free(self._deck_wait(), or_else=lambda: self._stopping.is_set() or self._deck_wanted())
            if self._stopping.is_set():
                break
            if free > 0 and len(self._deck):
                self._begin_from_deck(queue, free)
            elif free > 0:
                self._claim(queue, min(free, config.claim_batch), marks_begun)
            elif self._deck_wanted():
                self._claim(queue, min(self._deck.room(), config.claim_batch), None)

    def wake(self) -> None:
        """New work may be due (a broadcast, recovered jobs), or the database is back (the lifeline
        reconnected): look for it now, deck included."""
        self._deck_retry_at = 0.0
        self._retry.set()
        self._slots.notify()

    def _deck_wanted(self) -> bool:
        return self._deck.wants_more() and self._deck_pays() and time.monotonic() >= self._deck_retry_at

    def _deck_pays(self) -> bool:
        """Whether refilling slots from a deck costs less than claiming for them (see MARK_COST)."""
        size = self._deck.size
        return size > 0 and self._completer.group_size < 1 / (MARK_COST + 2 / size)

    def _deck_wait(self) -> float:
        """How long to wait for a free slot before looking at the deck again."""
        left = self._deck_retry_at - time.monotonic()
        return self._config.poll_interval if left <= 0 else max(0.005, min(self._config.poll_interval, left))

    def _claim(self, queue: JobQueue, wanted: int, marks_begun: bool | None) -> None:
        """One claim: for free slots (``marks_begun`` True or False: jobs go to the senders now,
        through the gate when they are unmarked), or for the deck (None: claimed unmarked, sent
        once a slot is theirs)."""
        self.busy = True
        for_deck = marks_begun is None
        token = uuid.uuid4()
        # Held before the claim commits, so orphan recovery never takes a claim about to be sent.
        self._claims.hold(token)
        self._unanswered = token
        flushes = self._completer.flushes
        with self._journal.beginning():  # a settle waits until this claim's begun jobs are journaled
            jobs, unmarked, begun = self._claim_in(queue, token, wanted, marks_begun, flushes)
        self.dry = len(jobs) < wanted
        self.busy = False
        if for_deck:
            if self.dry:
                # Nothing more due now: the deck waits (the slots do not: the loop still begins
                # the deck's jobs as they free up, where sleeping on new work would not).
                self._deck_retry_at = time.monotonic() + self._wait()
        elif not jobs or (unmarked and not begun):
            self._wait_for_work(self._wait())

    def _claim_in(self, queue: JobQueue, token: uuid.UUID, wanted: int, marks_begun: bool | None,
                  flushes: int) -> tuple[list[ClaimedJob], list[ClaimedJob], list[ClaimedJob]]:
        """The claim statement and what becomes of its jobs: (claimed, claimed unmarked, begun)."""
        for_deck = marks_begun is None
        with self._claim_duration.time(), self._waits.watch("claim", queue.conn):
            jobs = queue.claim(wanted, token, begun=False if for_deck else marks_begun)
        claimed_at = time.monotonic()
        if jobs:
            # A synchronous commit: results committed asynchronously before it, in the same
            # server epoch, are durable now.
            self._completer.covered(flushes, jobs[0].claim_epoch)
        for job in jobs:
            if job.suppressed:
                log.info("job_suppressed", job_id=job.id, broadcast_id=job.broadcast_id)
        live = [j for j in jobs if not j.suppressed]
        self._contents.load(queue, {j.campaign_id for j in live})
        if for_deck:
            self._unanswered = None
            self._claims.expect(token, len(live))
            self._deck.put((job, claimed_at) for job in live)
            begun, unmarked = live, []
        else:
            begun = [j for j in live if j.send_begun]
            unmarked = [j for j in live if not j.send_begun]
            if unmarked:
                with self._waits.watch("claim", queue.conn):
                    begun += self._gate.admit(queue, token, unmarked)
            self._unanswered = None
            self._claims.expect(token, len(begun))
            self._start(begun, claimed_at)
        return jobs, unmarked, begun

    def _begin_from_deck(self, queue: JobQueue, free: int) -> None:
        """Slots freed with jobs on the deck that the completer did not take: begin them here,
        through the gate (a campaign's own rate), one statement per claim they came in."""
        self.busy = True
        by_token: dict[uuid.UUID, list[tuple[ClaimedJob, float]]] = defaultdict(list)
        for job, claimed_at in self._deck.take(free):
            by_token[job.claim_token].append((job, claimed_at))
        with self._journal.beginning():
            self._begin_deck_claims(queue, by_token)

    def _begin_deck_claims(self, queue: JobQueue, by_token: dict[uuid.UUID, list[tuple[ClaimedJob, float]]]) -> None:
        try:
            while by_token:
                token, entries = next(iter(by_token.items()))
                jobs = [job for job, _ in entries]
                with self._waits.watch("claim", queue.conn):
                    begun = {j.id for j in self._gate.admit(queue, token, jobs)}
                # Neither begun nor held back by a limit: its campaign stopped sending since the
                # claim. Back as it was (a no-op for those held back: jobs_begin put them back).
                rest = [j for j in jobs if j.id not in begun]
                if rest:
                    queue.release(rest)
                    self._settle(rest)
                del by_token[token]
                for job, claimed_at in entries:
                    if job.id in begun:
                        self._start([job], claimed_at)
        finally:
            # The database went away mid-way: what was not begun here goes back on the deck (a mark
            # that committed without its reply is harmless: marked again, or cleared by a release).
            self._deck.put((entry for entries in by_token.values() for entry in entries), front=True)
            self.busy = False

    def _start(self, jobs: list[ClaimedJob], claimed_at: float) -> None:
        """Jobs marked begun: the journal, their slots, then the senders."""
        self._journal.began(jobs)
        self._slots.take(len(jobs))
        for job in jobs:
            self._senders.submit(Dispatch(job, claimed_at))

    @property
    def settling(self) -> bool:
        """A claim whose reply never came is still to be put back: the node is not idle."""
        return self._unanswered is not None

    @property
    def holding(self) -> bool:
        """Jobs held back by a limit are due later (see PacingGate.holding)."""
        return self._gate.holding

    def _wait(self) -> float:
        """Until new work may be due: the poll interval, or sooner when a held-back job falls due."""
        due = self._gate.next_due
        if due is None:
            return self._config.poll_interval
        return max(0.005, min(self._config.poll_interval, due - time.monotonic()))
