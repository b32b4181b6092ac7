"""`senddock run`: one node with its lifeline, its workers, and the periodic chores.

Start: register the node and take its lock, recover at once what earlier incarnations of this
node's name left behind, start the workers. Every poll interval: recover the jobs of nodes whose
lease ran out, raise the claim floors of sending broadcasts, start scheduled campaigns whose time
has come, fail what cancelled campaigns left behind, re-run bounce hooks that did not complete,
finish campaigns with nothing left.
Stop (SIGTERM, Ctrl-C, or idle with --exit-when-idle): stop claiming, let in-flight sends finish
within the shutdown timeout, put claimed-but-unstarted jobs back, mark the node stopped.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import psycopg
import structlog

from senddock.mail.compose import Composer
from senddock.config import Config
from senddock.core.breaker import FailureRuns, Prober
from senddock.core.db import Database
from senddock.core.epoch import ensure_epoch
from senddock.core.nodes import Lifeline, NodeIdentity
from senddock.core.queue import Queue
from senddock.core.suppressions import Suppressions
from senddock.core.worker import Worker
from senddock.errors import DatabaseError, SenddockError, error_line
from senddock.outcome import (
    Bounce,
    BounceKind,
    BounceSource,
    Classification,
    JobRef,
)

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


class Runner:
    def __init__(
        self,
        config: Config,
        *,
        db: Database | None = None,
        workers: int | None = None,
        node_name: str | None = None,
        exit_when_idle: bool = False,
    ) -> None:
        self.config = config
        self.pm = config.plugin_manager
        self.worker_count = workers or config.workers
        # One connection per worker, plus the chores and the suppressions' writes.
        pool_size = max(config.database.pool_size, self.worker_count + 3)
        self.db = db or Database(config.database, application_name="senddock-run", pool_size=pool_size)
        # The name is taken (or chosen) by the lifeline when it registers the node.
        self.node = NodeIdentity.new(node_name or config.node_name or "")
        self.exit_when_idle = exit_when_idle
        self.stopping = threading.Event()
        self.stats = RunStats()
        self.suppressions = Suppressions(self.db)
        # Before the first claim: a DKIM key that cannot be read stops the node at start-up.
        self.composer = Composer(config)
        self._wake = threading.Condition()
        self.failure_runs = FailureRuns(config.max_consecutive_failures)
        self.lifeline = Lifeline(config, self.db, self.node, self.wake_workers)
        self.prober = Prober(config, self.db, self.queue, self.stopping, self.wake_workers)
        self.workers: list[Worker] = []
        # Claim tokens of the batches workers hold; set.add/discard are atomic under the GIL.
        self.held_tokens: set = set()

    def queue(self, conn: psycopg.Connection) -> Queue:
        return Queue(conn, self.node, result_commit=self.config.database.result_commit)

    # -- shared with workers -------------------------------------------------------------------

    def wake_workers(self) -> None:
        with self._wake:
            self._wake.notify_all()

    def wait_for_work(self) -> None:
        with self._wake:
            if not self.stopping.is_set():
                self._wake.wait(self.config.poll_interval)

    def finish_campaigns(self, queue: Queue, broadcast_ids: Iterable[int] | None = None) -> None:
        targets = list(broadcast_ids) if broadcast_ids is not None else [None]
        for broadcast_id in targets:
            for campaign_id, finished_broadcast in queue.finish_campaigns(broadcast_id):
                log.info("campaign_finished", campaign_id=campaign_id, broadcast_id=finished_broadcast)

    @contextmanager
    def _queue_for(self, queue: Queue | None) -> Iterator[Queue]:
        """The worker's own queue when it has one: a second pooled connection per worker could
        starve the pool."""
        if queue is not None:
            yield queue
        else:
            with self.db.connection() as conn:
                yield self.queue(conn)

    def pause_campaign(self, campaign_id: int, reason: str, queue: Queue | None = None, *,
                       auto_resume: bool = False) -> None:
        probe_in = self.config.breaker.probe_interval
        with self._queue_for(queue) as q:
            if q.pause_campaign(campaign_id, reason, auto_resume=auto_resume, probe_in=probe_in):
                log.warning("campaign_paused", campaign_id=campaign_id, reason=reason,
                            resumes="when the relay answers a probe" if auto_resume else "by `campaign resume`")
        self.failure_runs.forget(campaign_id)

    def track_failures(self, campaign_id: int, verdict: Classification, queue: Queue | None = None) -> None:
        """Pause a campaign after too many failures in a row that no recipient caused."""
        trip = self.failure_runs.track(campaign_id, verdict)
        if trip is not None:
            self.pause_campaign(campaign_id, trip.reason, queue, auto_resume=trip.auto_resume)

    def bounced(self, bounce: Bounce, queue: Queue | None = None) -> bool:
        """After a bounce is recorded: the bounce-rate breaker, then the hooks unless it holds them.
        Returns whether the hooks ran."""
        job = bounce.job
        with self._queue_for(queue) as q:
            tripped, holding = q.bounce_check(job.campaign_id, job.broadcast_id, self.config.breaker)
            if tripped:
                self.failure_runs.forget(job.campaign_id)
                log.warning("campaign_paused", campaign_id=job.campaign_id, reason="bounce_rate",
                            resumes="by `campaign resume` (the bounces were real) or after "
                                    "`campaign unsuppress --since-pause` (they were not)")
            if holding:
                q.bounce_hold(job.job_id)  # its hooks wait until a person decides
                return False
        self.run_bounce_hooks(bounce, queue)
        return True

    def run_bounce_hooks(self, bounce: Bounce, queue: Queue | None = None) -> bool:
        """on_bounced for every plugin, outside any transaction; the pending row goes once all returned."""
        try:
            self.pm.hook.on_bounced(bounce=bounce, suppressions=self.suppressions, config=self.config)
            done = True
        except Exception as exc:
            log.error("plugin_failed", hook="on_bounced", error=repr(exc), email=bounce.email, retry_in="10m")
            done = False
        if bounce.job is not None:
            with self._queue_for(queue) as q:
                (q.bounce_done if done else q.bounce_retry_later)(bounce.job.job_id)
        return done

    # -- the node --------------------------------------------------------------------------------

    def request_stop(self) -> None:
        self.stopping.set()
        self.wake_workers()

    def run(self) -> dict[str, int]:
        started = time.monotonic()
        self.lifeline.start()
        if not self.lifeline.registered.wait(self.config.database.connect_timeout + self.config.recovery.lease + 5) \
                or self.lifeline.error:
            self.lifeline.stop()
            if isinstance(self.lifeline.error, SenddockError):
                raise self.lifeline.error
            raise DatabaseError(f"cannot register the node: {self.lifeline.error or 'the database did not answer'}")
        self.node = self.lifeline.node
        # Before the pool opens (the first chore): its sessions carry the node's name.
        self.db.name_sessions(f"senddock-run {self.node.name}")
        log.info("node_started", node=self.node.name, node_id=str(self.node.id), pid=self.node.pid,
                 workers=self.worker_count, transport=self.config.transport)
        self._chores()  # recover earlier incarnations of this node at once, before any claim
        self.workers = [Worker(self, i) for i in range(self.worker_count)]
        for worker in self.workers:
            worker.start()
        self.prober.start()
        try:
            while not self.stopping.wait(self.config.poll_interval):
                if self.lifeline.error is not None:
                    break  # its name was taken by another live process: stop before anyone sends twice
                self._chores()
                if self.exit_when_idle and self._idle():
                    log.info("node_idle")
                    break
        finally:
            log.info("node_stopping", node=self.node.name)
            self._shutdown()
        summary = {**self.stats.snapshot(), "seconds": round(time.monotonic() - started, 1)}
        log.info("node_stopped", node=self.node.name, node_id=str(self.node.id), **summary)
        if isinstance(self.lifeline.error, SenddockError):
            raise self.lifeline.error
        return summary

    def _chores(self) -> None:
        try:
            with self.db.connection() as conn:
                queue = self.queue(conn)
                ensure_epoch(conn)
                recovery = self.config.recovery
                # Dead incarnations' jobs and this node's own unheld ones, in one statement.
                recovered = queue.recover(
                    lease=recovery.lease, in_doubt=recovery.in_doubt, max_rescues=recovery.max_rescues,
                    orphans_of=list(self.held_tokens),
                )
                for job in recovered:
                    log.warning("job_recovered", job_id=job.id, broadcast_id=job.broadcast_id, status=job.status,
                                in_doubt=job.in_doubt, failure_reason=job.failure_reason, dead_node=job.dead_node)
                self.stats.count("recovered", len(recovered))
                # Claims start at each broadcast's floor: raised once a poll, so a claim never walks
                # more than one poll's worth of drained jobs, whatever snapshot is open.
                queue.raise_claim_floors()
                started = queue.start_scheduled()
                for campaign_id, broadcast_id in started:
                    log.info("campaign_started", campaign_id=campaign_id, broadcast_id=broadcast_id, scheduled=True)
                if recovered or started:
                    self.wake_workers()
                queue.cancel_leftovers()
                for row in queue.pending_bounces(recovery.lease):
                    self.run_bounce_hooks(Bounce(
                        email=row["email"], kind=BounceKind.BOUNCE, source=BounceSource.TRANSPORT, code=row["code"],
                        enhanced_code=row["enhanced_code"], diagnostic=row["diagnostic"] or "",
                        job=JobRef(row["job_id"], row["broadcast_id"], row["campaign_id"]),
                    ))
                self.finish_campaigns(queue)
        except psycopg.OperationalError as exc:
            log.warning("chores_db_lost", error=error_line(exc))

    def _idle(self) -> bool:
        if any(w.busy for w in self.workers):
            return False
        try:
            with self.db.connection() as conn:
                return not self.queue(conn).due_work_exists() and not any(w.busy for w in self.workers)
        except psycopg.OperationalError:
            return False

    def _shutdown(self) -> None:
        self.request_stop()
        deadline = time.monotonic() + self.config.shutdown_timeout
        for worker in self.workers:
            worker.join(max(0.0, deadline - time.monotonic()))
        stuck = [w.name for w in self.workers if w.is_alive()]
        if stuck:
            log.error("shutdown_timeout", workers=stuck)
        if self.prober.is_alive():
            self.prober.join(max(1.0, deadline - time.monotonic()))
        self.lifeline.stop()
        self.lifeline.join(5)
        self.db.close()
