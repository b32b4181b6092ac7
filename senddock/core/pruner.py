"""A node's retention pruning: every ``retention.every``, what is due goes (senddock.store.retention),
by one node of the cluster at a time, on a thread and a session of its own so that sending never
waits for it."""

from __future__ import annotations

import threading

import psycopg
import structlog

from senddock.config.sections import RetentionSettings
from senddock.errors import error_line
from senddock.observe.node_metrics import NodeMetrics
from senddock.store.db import Database
from senddock.store.retention import prune_due

log = structlog.get_logger("senddock.pruner")

# pg_try_advisory_lock(class, key): one pruning node in the cluster (0x5E4D: node locks).
PRUNE_LOCK = (0x5E50, 1)


class Pruner(threading.Thread):
    def __init__(self, db: Database, retention: RetentionSettings, metrics: NodeMetrics) -> None:
        super().__init__(name="senddock-pruner", daemon=True)
        self.db = db
        self.retention = retention
        self.metrics = metrics
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.wait(self.retention.every):
            try:
                self.prune_once()
            except psycopg.Error as exc:  # the database away: next time
                log.warning("prune_failed", error=error_line(exc, dsns=[self.db.session_dsn]))

    def stop(self) -> None:
        self.stopping.set()

    def prune_once(self) -> bool:
        """Prune what is due, if no other node is; whether this node pruned."""
        # A session of its own (direct_dsn behind a pooler): the lock is held across the campaigns'
        # transactions, and ends with the session if this node dies.
        with self.db.connect_session(autocommit=True) as conn:
            if not conn.execute("SELECT pg_try_advisory_lock(%s, %s)", PRUNE_LOCK).fetchone()[0]:
                return False
            report = prune_due(conn, self.retention)
        tables: dict[str, int] = dict(report.expired)
        for pruned in report.pruned:
            for table, rows in pruned.rows.items():
                tables[table] = tables.get(table, 0) + rows
        for table, rows in tables.items():
            self.metrics.pruned_rows.labels(table=table).inc(rows)
        if report.pruned or any(report.expired.values()) or report.skipped:
            log.info("pruned", campaigns=[p.campaign_id for p in report.pruned], rows=tables,
                     skipped={s.campaign_id: s.reason for s in report.skipped})
        return True
