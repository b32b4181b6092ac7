"""The claimer: one per node, claims as many due jobs as the node has free send slots.

Each claim is one statement on the claimer's own connection, committed synchronously, sized to
the free slots (at most ``claim_batch``), so a job is claimed only when a sender is free to start
it at once. Without limits the claim marks every job begun itself; with limits the pacing gate
decides which may begin (see pacing_gate). Then the jobs go to the senders.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable

import psycopg
import structlog

from senddock.config import Config
from senddock.core.completer import Completer
from senddock.core.content import ContentCache
from senddock.core.db import Database
from senddock.core.epoch import ensure_epoch
from senddock.core.inflight import HeldClaims, Slots
from senddock.core.nodes import Lifeline
from senddock.core.pacing_gate import PacingGate
from senddock.core.queue import Queue
from senddock.core.senders import Dispatch, Senders
from senddock.errors import error_line
from senddock.observe.node_metrics import NodeMetrics

log = structlog.get_logger(__name__)


class Claimer(threading.Thread):
    def __init__(
        self,
        config: Config,
        db: Database,
        queue_for_conn: Callable[[psycopg.Connection], Queue],
        *,
        slots: Slots,
        claims: HeldClaims,
        contents: ContentCache,
        gate: PacingGate,
        senders: Senders,
        completer: Completer,
        lifeline: Lifeline,
        stopping: threading.Event,
        wait_for_work: Callable[[float], None],
        metrics: NodeMetrics | None = None,
    ) -> None:
        super().__init__(name="senddock-claimer", daemon=True)
        self._config = config
        self._db = db
        self._queue_for_conn = queue_for_conn
        self._slots = slots
        self._claims = claims
        self._contents = contents
        self._gate = gate
        self._senders = senders
        self._completer = completer
        self._lifeline = lifeline
        self._stopping = stopping
        self._wait_for_work = wait_for_work
        self._claim_duration = (metrics or NodeMetrics()).claim_duration
        self._unanswered: uuid.UUID | None = None  # a claim whose reply never came
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
            self._stopping.wait(backoff)
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

    def _put_back_unanswered(self, queue: Queue) -> None:
        """A claim (or its begin marks) whose reply never came: nothing of it reached a sender."""
        token, self._unanswered = self._unanswered, None
        if token is not None:
            released = queue.release_claim(token)
            if released:
                log.info("claim_put_back", jobs=released)
            self._claims.let_go(token)

    def _loop(self, queue: Queue) -> None:
        config = self._config
        marks_begun = not self._gate.configured
        while not self._stopping.is_set():
            if not self._lifeline.may_send():
                self._wait_for_work(config.poll_interval)  # self-fenced: no claims until the heartbeat is back
                continue
            free = self._slots.wait_free(config.poll_interval)
            if free <= 0 or self._stopping.is_set():
                continue
            self.busy = True
            wanted = min(free, config.claim_batch)
            token = uuid.uuid4()
            # Held before the claim commits, so orphan recovery never takes a claim about to be sent.
            self._claims.hold(token)
            self._unanswered = token
            flushes = self._completer.flushes
            with self._claim_duration.time():
                jobs = queue.claim(wanted, token, begun=marks_begun)
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
            begun = [j for j in live if j.send_begun]
            unmarked = [j for j in live if not j.send_begun]
            if unmarked:
                begun += self._gate.admit(queue, token, unmarked)
            self._unanswered = None
            self._claims.expect(token, len(begun))
            self._slots.take(len(begun))
            for job in begun:
                self._senders.submit(Dispatch(job, claimed_at))
            self.dry = len(jobs) < wanted
            self.busy = False
            if not jobs or (unmarked and not begun):
                self._wait_for_work(self._wait())

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
