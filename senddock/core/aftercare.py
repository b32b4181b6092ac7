"""After a result is committed: the breakers, a pause, adaptive pacing, its log line, the bounce hooks.

Told by the completer what each group commit recorded, in two steps. ``react`` first, in the
completer's thread and on its connection, before the group's slots go back and its senders go on:
the breakers, this node's halts for pause outcomes and the slowing of throttled limits, so that no
claim after the result that trips a breaker takes another of its campaign's jobs. Then ``put``:
the log lines and counts, and the bounce hooks in this thread (one per node), so a slow
``on_bounced`` plugin never holds a commit back. It borrows a pooled connection only when a result
needs the database (a bounce). Results that need neither the database nor a plugin are handled in
the completer's thread as it hands them over (see ``put``).
"""

from __future__ import annotations

import queue as queues
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import structlog

from senddock.config import Config
from senddock.core.breaker import FailureRuns
from senddock.store.db import Database
from senddock.core.inflight import Halts
from senddock.core.pacing_gate import PacingGate
from senddock.store.jobs import ClaimedJob, JobQueue, Recorded, ResultRow
from senddock.store.suppressions import Suppressions
from senddock.observe.node_metrics import NodeMetrics
from senddock.outcome import Bounce, BounceKind, BounceSource, Classification, JobRef
from senddock.pacing.adaptive import slows_pacing

log = structlog.get_logger(__name__)


@dataclass
class RunStats:
    counts: Counter = field(default_factory=Counter)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def count(self, what: str, n: int = 1) -> None:
        with self._lock:
            self.counts[what] += n

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self.counts)


@dataclass
class Committed:
    """A result as committed, for the aftercare."""

    row: ResultRow
    verdict: Classification
    recorded: Recorded
    hold_hooks: bool = False  # a bounce whose hooks wait for a person (the bounce-rate breaker tripped)
    hooks_ran: bool = False  # its on_bounced hooks ran (set here; read if it must be committed again)
    # What react did already, when a lost connection makes the completer call it again:
    reacted: bool = False  # its breakers checked
    slowed: bool = False  # its throttling slowed its pacing limit


class Aftercare(threading.Thread):
    def __init__(self, config: Config, db: Database, queue_for_conn: Callable[..., JobQueue], stats: RunStats,
                 metrics: NodeMetrics | None = None, halts: Halts | None = None,
                 pacing: PacingGate | None = None, on_idle: Callable[[], None] = lambda: None) -> None:
        super().__init__(name="senddock-aftercare", daemon=True)
        self.config = config
        self.pm = config.plugin_manager
        self._db = db
        self._queue_for_conn = queue_for_conn
        self.stats = stats
        self.metrics = metrics or NodeMetrics()
        self.suppressions = Suppressions(db)
        self.failure_runs = FailureRuns(config.max_consecutive_failures)
        self.halts = halts or Halts()  # campaigns its breakers paused: their jobs marked ahead stay unsent
        self._pacing = pacing  # slows the limits of sends the provider throttled (None: no pacing here)
        self._inbox: queues.SimpleQueue[list[Committed] | None] = queues.SimpleQueue()
        self._idle = threading.Event()
        self._idle.set()
        self._on_idle = on_idle  # told each time everything handed over has been handled
        self._pending = 0
        self._lock = threading.Lock()

    # -- told by the completer -----------------------------------------------------------------

    def halt(self, campaign_ids: Iterable[int]) -> None:
        """A group commit found these campaigns paused or cancelled elsewhere (a person, another
        node): this node's next jobs of them, marked begun already (inflight.RUNWAY), go back
        unsent from now on."""
        for campaign_id in campaign_ids:
            self.halts.add(campaign_id)

    def react(self, queue: JobQueue, results: list[Committed]) -> None:
        """What a group's results lead to before their slots go back and their senders go on, on
        the completer's connection: the bounce-rate breaker, the failure breaker, the slowing of
        the limits a provider throttled, and this node's halt of a campaign a pause outcome paused
        (the jobs marked ahead of it stay unsent). Called again with the same results when the
        completer's connection was lost meanwhile: what is done already is not done again."""
        for item in results:
            if item.reacted:
                continue
            job, outcome = item.row.job, item.row.result
            if outcome.bounce and self.check_bounce(queue, job):
                item.hold_hooks = True
            if item.recorded.recorded and outcome.outcome != "pause":
                self.track_failures(queue, job.campaign_id, item.verdict)
            item.reacted = True
        throttled = [i for i in results if i.verdict is not None and slows_pacing(i.verdict) and not i.slowed]
        if throttled:
            if self._pacing is not None:
                self._pacing.throttled(queue, [item.row.job for item in throttled])
            for item in throttled:
                item.slowed = True
        for item in results:
            if item.row.result.outcome == "pause":
                # Paused by this commit (or before it): the next jobs marked for senders stay unsent.
                self.halts.add(item.row.job.campaign_id)

    def put(self, items: list[Committed]) -> None:
        """A group commit's results. Those that need neither the database nor a plugin (all but
        bounces: a log line and counts) are handled here, in the caller's thread: waking this one
        for them cost more than the work (at concurrency 5 against a local relay, a tenth of the
        completer's time went to that wake-up). Bounces are handed over at once: one wake-up of
        this thread per group that has any."""
        if not items:
            return
        with self._lock:  # busy until every one is handled, here or there
            self._pending += len(items)
            self._idle.clear()
        later = []
        for item in items:
            if item.row.result.bounce:
                later.append(item)
            else:
                self._handle_safely(item)
        if later:
            self._inbox.put(later)
        self._handled(len(items) - len(later))

    @property
    def busy(self) -> bool:
        return not self._idle.is_set()

    def finish(self, timeout: float) -> None:
        """Handle what is queued, then stop."""
        self._inbox.put(None)
        self.join(timeout)

    def run(self) -> None:
        while (items := self._inbox.get()) is not None:
            for item in items:
                self._handle_safely(item)
            self._handled(len(items))

    def _handled(self, count: int) -> None:
        with self._lock:
            self._pending -= count
            idle = not self._pending
            if idle:
                self._idle.set()
        if idle:
            self._on_idle()

    # -- one result ----------------------------------------------------------------------------

    def _handle_safely(self, item: Committed) -> None:
        try:
            self.handle(item)
        except Exception:
            # A failed bounce hook is retried by the chores (pending_bounces); never a dead thread,
            # nor a completer stopped by a result's aftermath.
            log.exception("aftercare_error", job_id=item.row.job.id)

    def handle(self, item: Committed) -> None:
        job, outcome, recorded, verdict = item.row.job, item.row.result, item.recorded, item.verdict
        log.info(
            "send_attempt",
            job_id=job.id,
            broadcast_id=job.broadcast_id,
            attempt=job.attempts + 1,
            outcome=outcome.outcome if recorded.recorded else ("sent" if recorded.late_sent else "claim_lost"),
            code=outcome.code,
            enhanced_code=outcome.enhanced_code,
            reason=verdict.reason,
            failed_as=outcome.failure_reason if outcome.status == "failed" else None,
            retry_in=round(outcome.delay, 1) if outcome.delay is not None else None,
            in_doubt=outcome.in_doubt or None,
        )
        self.stats.count(outcome.outcome if recorded.recorded else "claim_lost")
        # Every committed result is one attempt row, whatever became of its claim: counted by its
        # outcome, as the database records it (a throttling deferral is a retry there).
        throttled = outcome.outcome == "retry" and outcome.deferred and verdict.throttled
        self.metrics.sent(self.config.transport, "throttled" if throttled else outcome.outcome)
        if outcome.bounce:
            # Even under a lost claim: the address is dead whoever owns the job now.
            if item.hold_hooks:
                with self._queue() as q:
                    q.bounce_hold(job.id)  # its hooks wait until a person decides
            else:
                item.hooks_ran = self.run_bounce_hooks(self._bounce(item.row))
        if not recorded.recorded:
            return
        if outcome.outcome == "pause":
            # Paused in the commit that recorded it (jobs_record_results).
            self.failure_runs.forget(job.campaign_id)
            if recorded.paused_now:
                log.warning("campaign_paused", campaign_id=job.campaign_id, reason=verdict.reason,
                            resumes="by `campaign resume`")


    @staticmethod
    def _bounce(row: ResultRow) -> Bounce:
        job, outcome = row.job, row.result
        return Bounce(
            email=job.email,
            kind=BounceKind.BOUNCE,
            source=BounceSource.TRANSPORT,
            code=outcome.code,
            enhanced_code=outcome.enhanced_code,
            diagnostic=outcome.last_result,
            job=JobRef(job.id, job.broadcast_id, job.campaign_id),
        )

    # -- what a result may lead to -------------------------------------------------------------

    @contextmanager
    def _queue(self) -> Iterator[JobQueue]:
        with self._db.connection() as conn:
            yield self._queue_for_conn(conn)

    def track_failures(self, queue: JobQueue, campaign_id: int, verdict: Classification) -> None:
        """Pause a campaign after too many failures in a row that no recipient caused.

        Called by ``react``, on the completer's connection before the results' slots go back, so
        no claim after the run's last failure takes another of the campaign's jobs. A bad address
        (about the recipient, refused before the transport) neither adds to a run of relay
        failures nor ends one: only deliveries end runs."""
        trip = self.failure_runs.track(campaign_id, verdict)
        if trip is None:
            return
        self.halts.add(campaign_id)
        if queue.pause_campaign(campaign_id, trip.reason, auto_resume=trip.auto_resume,
                                probe_in=self.config.breaker.probe_interval):
            log.warning("campaign_paused", campaign_id=campaign_id, reason=trip.reason,
                        resumes="when the relay answers a probe" if trip.auto_resume else "by `campaign resume`")
        self.failure_runs.forget(campaign_id)

    def check_bounce(self, queue: JobQueue, job: ClaimedJob) -> bool:
        """After a bounce is recorded: the bounce-rate breaker, by ``react`` on the completer's
        connection before the slots go back (so no claim after the bounce that trips it takes more
        of the campaign).
        Returns whether the bounce's hooks must wait for a person."""
        tripped, holding = queue.bounce_check(job.campaign_id, job.broadcast_id, self.config.breaker)
        if tripped:
            self.halts.add(job.campaign_id)
            self.failure_runs.forget(job.campaign_id)
            log.warning("campaign_paused", campaign_id=job.campaign_id, reason="bounce_rate",
                        resumes="by `campaign resume` (the bounces were real) or after "
                                "`campaign unsuppress --since-pause` (they were not)")
        return holding

    def run_bounce_hooks(self, bounce: Bounce) -> bool:
        """on_bounced for every plugin, outside any transaction; the pending row goes once all returned."""
        try:
            self.pm.hook.on_bounced(bounce=bounce, suppressions=self.suppressions, config=self.config)
            done = True
        except Exception as exc:
            log.error("plugin_failed", hook="on_bounced", error=repr(exc), email=bounce.email, retry_in="10m")
            done = False
        if bounce.job is not None:
            with self._queue() as q:
                (q.bounce_done if done else q.bounce_retry_later)(bounce.job.job_id)
        return done
