"""`senddock run`: one node with its lifeline, its claimer, senders and completer, and the chores.

Start: register the node and take its lock, recover at once what earlier incarnations of this
node's name left behind, start the pipeline: a claimer claims jobs for the free send slots
(``concurrency``) and for the deck (jobs claimed ahead), senders send them, a completer records
their results in groups and refills the freed slots from the deck in the same commit, the
aftercare acts on what was recorded (see docs/engine.md). Every poll interval: recover the jobs of
nodes whose lease ran out, raise the claim floors of sending broadcasts, start scheduled campaigns
whose time has come, fail what cancelled campaigns left behind, re-run bounce hooks that did not
complete, finish campaigns with nothing left.
Stop (SIGTERM, Ctrl-C, or idle with --exit-when-idle): stop claiming, let in-flight sends finish
within the shutdown timeout, put claimed-but-unstarted jobs back, mark the node stopped.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import psycopg
import structlog

from senddock.config import Config
from senddock.config.digest import short_digest
from senddock.core.aftercare import Aftercare, RunStats
from senddock.core.breaker import Prober
from senddock.core.claimer import Claimer
from senddock.core.completer import Completer, Wiring
from senddock.core.config_watch import ConfigWatch
from senddock.core.content import ContentCache
from senddock.store.db import Database
from senddock.core.epoch import ensure_epoch
from senddock.core.inbox import Inbox
from senddock.core.inflight import DECK_FLOOR, RUNWAY, Deck, Halts, HeldClaims, Slots
from senddock.core.journal import Journal
from senddock.store.migrations import applied_versions, latest_version
from senddock.core.nodes import Lifeline
from senddock.store.node_identity import NodeIdentity
from senddock.core.pacing_gate import PacingGate
from senddock.store.jobs import JobQueue
from senddock.core.pruner import Pruner
from senddock.core.senders import Senders
from senddock.core.waits import Waits, Watchdog
from senddock.errors import ConfigError, DatabaseError, SenddockError, error_line
from senddock.mail.compose import Composer
from senddock.observe.health_server import HealthServer
from senddock.observe.node_metrics import NodeMetrics
from senddock.outcome import Bounce, BounceKind, BounceSource, JobRef
from senddock.webhooks.deliverer import Webhooks
from senddock.config.webhooks import endpoints, subscriptions

log = structlog.get_logger(__name__)

# The lifeline, the claimer, the completer and one for the chores, the prober and the aftercare.
MIN_POOL_SIZE = 4
# How often a node folds the tallies of ended sessions (migration 11): often enough that the
# table stays small, rare enough to cost nothing.
FOLD_TALLIES_EVERY = 60.0
# Seconds the first claim waits for the senders' worker_started hooks (connections opened ahead):
# enough for a relay to greet hundreds of sessions, short enough that a dead one barely delays it.
SENDERS_READY_WAIT = 5.0

__all__ = ["MIN_POOL_SIZE", "RunStats", "Runner"]


class Runner:
    def __init__(
        self,
        config: Config,
        *,
        db: Database | None = None,
        concurrency: int | None = None,
        node_name: str | None = None,
        exit_when_idle: bool = False,
    ) -> None:
        self.config = config
        self.pm = config.plugin_manager
        self.concurrency = concurrency or config.concurrency
        pool_size = config.database.pool_size
        if pool_size < MIN_POOL_SIZE:
            source = config.path or "<defaults>"
            raise ConfigError([f"{source}::$.database.pool_size: {pool_size} is too few connections for "
                               f"`senddock run`: it needs at least {MIN_POOL_SIZE} (the lifeline, the claimer, "
                               "the completer, the chores), whatever its concurrency"])
        # Every connection of the node, the lifeline's included, fits in database.pool_size at any
        # concurrency: sends hold no connection.
        self.db = db or Database(config.database, application_name="senddock-run", pool_size=pool_size - 1)
        # The name is taken (or chosen) by the lifeline when it registers the node.
        self.node = NodeIdentity.new(node_name or config.node_name or "")
        self.exit_when_idle = exit_when_idle
        self.stopping = threading.Event()
        self._look = threading.Event()  # wakes the main loop before its poll: stopping, or maybe idle
        self.stats = RunStats()
        self.webhooks = subscriptions(config.data)
        self.metrics = NodeMetrics()
        # Delivered by every node from the shared outbox; no thread at all without webhooks.
        self.deliverers = Webhooks(endpoints(config.data), self.db, poll_interval=config.poll_interval,
                                   metrics=self.metrics)
        self.metrics.count_in_flight(lambda: self.slots.in_use)
        self.metrics.failover_window.set(config.recovery.failover_window)
        self._health: HealthServer | None = None
        self._tallies_folded_at = float("-inf")
        self._unsettled_said_at = float("-inf")
        # Before the first claim: a DKIM key that cannot be read stops the node at start-up.
        self.composer = Composer(config)
        self._wake = threading.Condition()
        # Claims, group commits and heartbeats in progress: a watchdog reports those that hang.
        self.waits = Waits()
        self.lifeline = Lifeline(config, self.db, self.node, self.wake_workers, self.waits)
        self.config_watch = ConfigWatch(config)  # says when the file no longer holds what the node runs
        self.watchdog = Watchdog(self.waits, stuck_after=config.database.stuck_after, connect=self._watchdog_connection,
                                 gauge=self.metrics.database_wait)
        self.prober = Prober(config, self.db, self.queue, self.stopping, self.wake_workers)
        self.pruner = Pruner(self.db, config.retention, self.metrics)  # history past its retention goes
        self.halts = Halts()  # campaigns stopped since their next jobs were marked (see inflight.RUNWAY)
        self.gate = PacingGate(config.pacing, config.transport)
        self.aftercare = Aftercare(config, self.db, self.queue, self.stats, self.metrics, self.halts,
                                   pacing=self.gate, on_idle=self._may_be_idle)
        self.held_claims = HeldClaims()
        # What this node began and recorded lately, re-applied if the database loses it (failover).
        self.journal = Journal(config.recovery.failover_window)
        self.slots = Slots(self.concurrency)  # both sized when the pipeline starts
        self.deck = Deck(0, self.slots)
        self.claimer: Claimer | None = None
        self.senders: Senders | None = None
        self.completer: Completer | None = None

    @property
    def held_tokens(self) -> list:
        """The claim tokens this node holds (its orphan recovery leaves them alone)."""
        return self.held_claims.tokens()

    def queue(self, conn: psycopg.Connection) -> JobQueue:
        return JobQueue(conn, self.node, result_commit=self.config.database.result_commit, webhooks=self.webhooks,
                     lease=self.config.recovery.lease)

    # -- shared by the parts of the node -------------------------------------------------------

    def wake_workers(self) -> None:
        """Work may be due, or the lifeline is back: the claimer looks now, and a completer waiting
        to reconnect tries now."""
        with self._wake:
            self._wake.notify_all()
        if self.claimer is not None:
            self.claimer.wake()
        if self.completer is not None:
            self.completer.database_back()

    def wait_for_work(self, timeout: float | None = None) -> None:
        with self._wake:
            if not self.stopping.is_set():
                self._wake.wait(self.config.poll_interval if timeout is None else timeout)

    def finish_campaigns(self, queue: JobQueue, broadcast_ids: Iterable[int] | None = None) -> None:
        targets = list(broadcast_ids) if broadcast_ids is not None else [None]
        for broadcast_id in targets:
            for campaign_id, finished_broadcast in queue.finish_campaigns(broadcast_id):
                log.info("campaign_finished", campaign_id=campaign_id, broadcast_id=finished_broadcast)

    def results_in(self, queue: JobQueue, broadcasts: set[int]) -> bool:
        """The completer committed results of ``broadcasts`` (see completer.Node): once the queue
        runs dry they may have finished their campaigns, and the node may be idle."""
        if self.claimer is None or not self.claimer.dry:
            return False  # more is due: a campaign with jobs left is not finished
        self.finish_campaigns(queue, broadcasts)
        if self.completer is not None and not self.completer.pending:
            self._may_be_idle()
        return True

    # -- the node --------------------------------------------------------------------------------

    def request_stop(self) -> None:
        self.stopping.set()
        self._look.set()
        self.wake_workers()

    def _may_be_idle(self) -> None:
        """The last results are in (the completer) or handled (the aftercare): with
        ``exit_when_idle`` the main loop looks now rather than at its next poll. Not while slots
        are taken: the completer tells again once their results are in (and the aftercare once
        it has handled their bounces), and a look per group cost the main loop a wake-up each."""
        if self.exit_when_idle and not self.slots.in_use:
            self._look.set()

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
                 concurrency=self.concurrency, transport=self.config.transport,
                 config_digest=short_digest(self.lifeline.config_digest))
        self.metrics.name_node(self.node.name)
        self.watchdog.start()
        self.pruner.start()
        self._serve_health()
        self._chores()  # recover earlier incarnations of this node at once, before any claim
        self._start_pipeline()
        try:
            chores_at = time.monotonic()
            while True:
                self._look.wait(max(0.0, chores_at + self.config.poll_interval - time.monotonic()))
                self._look.clear()
                if self.stopping.is_set():
                    break
                if self.lifeline.error is not None:
                    break  # its name was taken by another live process: stop before anyone sends twice
                if time.monotonic() - chores_at >= self.config.poll_interval:  # a look adds no chores
                    self._chores()
                    self.config_watch.check()
                    chores_at = time.monotonic()
                if self.exit_when_idle and self._idle():
                    self._chores()  # the last word: campaigns the last results finished, before exiting
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
                self.metrics.in_doubt.inc(sum(1 for job in recovered if job.in_doubt))
                # Claims start at each broadcast's floor: raised once a poll, so a claim never walks
                # more than one poll's worth of drained jobs, whatever snapshot is open.
                queue.raise_claim_floors()
                started = queue.start_scheduled()
                for campaign_id, broadcast_id in started:
                    log.info("campaign_started", campaign_id=campaign_id, broadcast_id=broadcast_id, scheduled=True)
                if recovered or started:
                    self.wake_workers()
                queue.cancel_leftovers()
                self._report_unsettled(queue)
                lag = queue.replication_lag()
                self.metrics.replication_lag.set(float("nan") if lag is None else lag)
                for row in queue.pending_bounces(recovery.lease):
                    self.aftercare.run_bounce_hooks(Bounce(
                        email=row["email"], kind=BounceKind.BOUNCE, source=BounceSource.TRANSPORT, code=row["code"],
                        enhanced_code=row["enhanced_code"], diagnostic=row["diagnostic"] or "",
                        job=JobRef(row["job_id"], row["broadcast_id"], row["campaign_id"]),
                    ))
                self.finish_campaigns(queue)
                if time.monotonic() - self._tallies_folded_at >= FOLD_TALLIES_EVERY:
                    queue.fold_tallies()
                    self._tallies_folded_at = time.monotonic()
        except psycopg.OperationalError as exc:
            log.warning("chores_db_lost", error=error_line(exc))

    def _report_unsettled(self, queue: JobQueue) -> None:
        """Claims wait while a live node has not settled in the server's current epoch (after a
        failover or a crash that lost WAL): said once a lease, naming them, if it lasts."""
        waiting = queue.unsettled_nodes()
        if waiting and waiting[0][3] is not None and waiting[0][3] > self.config.poll_interval * 3 \
                and time.monotonic() - self._unsettled_said_at >= self.config.recovery.lease:
            self._unsettled_said_at = time.monotonic()
            log.warning("claims_wait_for_nodes", nodes=[f"{name} ({host}, pid {pid})" for name, host, pid, _ in waiting],
                        epoch_age_s=round(waiting[0][3], 1),
                        meaning="the database lost WAL (a failover, a crash): no node claims until these have "
                                "re-applied what they remember, or their lease has passed")

    def _watchdog_connection(self) -> psycopg.Connection:
        """Outside the pool, which stuck statements may hold; never waits long itself."""
        return psycopg.connect(self.db.dsn, **{**self.db.connect_kwargs(), "connect_timeout": 2,
                                               "application_name": f"senddock-watchdog {self.node.name}"[:63]})

    def _serve_health(self) -> None:
        """/metrics, /healthz and /readyz on metrics.listen, when it is set."""
        listen = self.config.metrics.listen
        if not listen:
            return
        host, _, port = listen.rpartition(":")
        try:
            self._health = HealthServer(host.strip("[]"), int(port), self.metrics.registry, self._not_ready).start()
        except OSError as exc:
            raise ConfigError([f"{self.config.path or '<defaults>'}::$.metrics.listen: cannot listen on {listen}: "
                               f"{exc.strerror or exc}"]) from None
        log.info("metrics_listening", listen=f"{host}:{self._health.port}")

    def _not_ready(self) -> list[str]:
        """Why this node should get no traffic now: what /readyz answers 503 with."""
        problems = self.watchdog.reasons()
        if self.lifeline.error is not None or not self.lifeline.may_send():
            problems.append("lifeline not held: the node is fenced until its heartbeat is back")
        try:
            with self.db.pool.connection(timeout=2) as conn:  # never waits long for the node's pool
                missing = latest_version() not in applied_versions(conn)
            if missing:
                problems.append(f"schema not current: migration {latest_version()} is not applied")
        except Exception as exc:  # noqa: BLE001 - any failure is "not ready", said in one line
            problems.append(f"database unreachable: {error_line(exc) if isinstance(exc, psycopg.Error) else exc}")
        return problems

    def _start_pipeline(self) -> None:
        contents = ContentCache(self._pooled_queue)
        # Without pacing limits every sender has its next job marked begun while it sends (see
        # inflight.RUNWAY): it never waits for a commit between two sends. Under limits a job begins
        # when its limits let it, so it goes to a sender at once: no more marks than senders.
        self.slots = Slots(self.concurrency if self.gate.configured else self.concurrency * RUNWAY)
        # Jobs claimed ahead, to refill the slots a group commit frees; none under pacing limits
        # (each job's limits are taken when it may begin, by the claimer's gate).
        self.deck = Deck(0 if self.gate.configured else min(max(self.slots.size, DECK_FLOOR), self.config.claim_batch),
                         self.slots)
        inbox = Inbox()  # the senders' results, for the completer
        self.senders = Senders(self.config, self.composer, contents, self.lifeline, self.stopping, inbox,
                               self.concurrency, self.metrics, self.halts)
        self.completer = Completer(self.db, self.queue, Wiring(
            inbox=inbox, slots=self.slots, deck=self.deck, claims=self.held_claims, journal=self.journal,
            waits=self.waits, lifeline=self.lifeline, stopping=self.stopping, senders=self.senders,
            aftercare=self.aftercare, node=self,
        ), async_results=self.config.database.result_commit == "async")
        self.claimer = Claimer(
            self.config, self.db, self.queue, slots=self.slots, deck=self.deck, claims=self.held_claims,
            contents=contents, gate=self.gate, senders=self.senders,
            completer=self.completer, lifeline=self.lifeline, stopping=self.stopping,
            wait_for_work=self.wait_for_work, journal=self.journal, waits=self.waits, metrics=self.metrics,
        )
        try:
            self.composer.warm_up()
        except Exception as exc:  # noqa: BLE001 - best effort: the first send reports what is wrong
            log.warning("warm_up_failed", error=repr(exc))
        self.aftercare.start()
        self.completer.start()
        self.senders.start()
        if not self.senders.wait_ready(SENDERS_READY_WAIT):
            # A transport still opening its connections (a relay that does not answer): claim
            # anyway; those threads send once it is done.
            log.warning("senders_not_ready", waited_s=SENDERS_READY_WAIT)
        self.claimer.start()
        self.prober.start()
        self.deliverers.start()

    @contextmanager
    def _pooled_queue(self) -> Iterator[JobQueue]:
        with self.db.connection() as conn:
            yield self.queue(conn)

    def _busy(self) -> bool:
        return bool(self.slots.in_use or len(self.deck)
                    or (self.claimer and (self.claimer.busy or self.claimer.holding or self.claimer.settling))
                    or (self.completer and self.completer.pending) or self.aftercare.busy)

    def _idle(self) -> bool:
        if self._busy():
            return False
        try:
            with self.db.connection() as conn:
                queue = self.queue(conn)
                # Events due now are part of the drain; those waiting for a retry are not.
                if self.deliverers.endpoint_ids and queue.webhooks_due(self.deliverers.endpoint_ids):
                    return False
                return not queue.due_work_exists() and not self._busy()
        except psycopg.OperationalError:
            return False

    def _shutdown(self) -> None:
        self.request_stop()
        self.pruner.stop()  # a prune under way finishes its campaign (one transaction each)
        self.deliverers.stop()  # events not delivered yet stay in the outbox for any node
        deadline = time.monotonic() + self.config.shutdown_timeout
        if self.claimer is not None:
            self.claimer.join(max(0.0, deadline - time.monotonic()))
        if self.senders is not None:
            sending, starting = self.senders.stop(deadline)
            if sending or starting:
                # A thread still in worker_started (a relay that does not answer its connect) never
                # began a send: said apart, so the line does not suggest sends were cut off.
                log.error("shutdown_timeout", senders=sending, in_worker_started=starting)
        if self.completer is not None:
            self.completer.close()
            self.completer.join(max(5.0, deadline - time.monotonic()))
        self.aftercare.finish(max(5.0, deadline - time.monotonic()))
        if self.prober.is_alive():
            self.prober.join(max(1.0, deadline - time.monotonic()))
        self.deliverers.join()
        if self.pruner.is_alive():
            self.pruner.join(max(1.0, deadline - time.monotonic()))
        self.lifeline.stop()
        self.lifeline.join(5)
        self.watchdog.stop()  # last: a stop that waits on a stuck commit is reported too
        if self._health is not None:
            self._health.stop()
        self.db.close()
