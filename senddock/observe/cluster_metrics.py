"""The cluster's Prometheus metrics, for `senddock serve`'s /metrics: what every node shares, read
from the database at scrape time.

Cheap by construction: job counts, bounces and suppressions come from the tallies that triggers
keep as rows change (migration 11), a few rows per key; the queue lag is the first entry of two
partial indexes per sending campaign; pacing is the one statement `senddock status` runs. Each
query is a statement of its own in autocommit, so a scrape never holds a snapshot open, and a
scrape within ``min_interval`` of the last one is answered from it (several Prometheus replicas, a
dashboard refreshing) rather than asking the database again.

A scrape while the database is unreachable answers ``senddock_cluster_up 0`` and nothing else:
the scrape itself succeeds, and the alert can say which of the two is down.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import psycopg
from psycopg.rows import dict_row
import structlog
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from senddock.config import Config
from senddock.store.db import Database
from senddock.domain.pacing_status import pacing_status
from senddock.store.queries import query
from senddock.errors import SenddockError, error_line

log = structlog.get_logger(__name__)

JOB_STATUSES = ("pending", "sending", "retry", "sent", "failed")
BOUNCE_KINDS = ("hard", "soft", "complaint")


@dataclass
class Reading:
    """One scrape's figures, as read from the database."""

    jobs: list[dict] = field(default_factory=list)
    totals: list[dict] = field(default_factory=list)
    lag: list[dict] = field(default_factory=list)
    pacing: list = field(default_factory=list)
    seconds: float = 0.0


class ClusterCollector(Collector):
    def __init__(self, config: Config, db: Database, *, min_interval: float = 5.0) -> None:
        self.config = config
        self.db = db
        self.min_interval = min_interval
        self._lock = threading.Lock()
        self._last: tuple[float, Reading] | None = None

    def registry(self) -> CollectorRegistry:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(self)
        return registry

    def describe(self) -> Iterator[Metric]:
        """Every family, without samples and without the database (what dashboards may name)."""
        yield self._up()
        yield from self._metrics(Reading())

    def collect(self) -> Iterator[Metric]:
        up = self._up()
        try:
            reading = self._reading()
        except (psycopg.Error, SenddockError, OSError) as exc:
            log.warning("metrics_database_unreachable", error=error_line(exc))
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        yield from self._metrics(reading)

    @staticmethod
    def _up() -> GaugeMetricFamily:
        return GaugeMetricFamily("senddock_cluster_up", "1 when the database answered this scrape, 0 when it did not.")

    def _reading(self) -> Reading:
        with self._lock:  # concurrent scrapes wait for one reading rather than each making their own
            now = time.monotonic()
            if self._last is not None and now - self._last[0] < self.min_interval:
                return self._last[1]
            reading = self._read()
            reading.seconds = time.monotonic() - now
            self._last = (time.monotonic(), reading)
            return reading

    def _read(self) -> Reading:
        with self.db.connection() as conn:  # autocommit: each statement its own short snapshot
            cur = conn.cursor(row_factory=dict_row)
            return Reading(
                jobs=cur.execute(query("metrics_jobs")).fetchall(),
                totals=cur.execute(query("metrics_totals")).fetchall(),
                lag=cur.execute(query("metrics_queue_lag")).fetchall(),
                pacing=list(pacing_status(conn, self.config.pacing, transport=self.config.transport)),
            )

    def _metrics(self, reading: Reading) -> Iterator[Metric]:
        jobs = GaugeMetricFamily("senddock_jobs", "Jobs of campaigns under way (and of those that ended in the "
                                 "last day), by status.", labels=["campaign", "status"])
        info = GaugeMetricFamily("senddock_campaign_info", "A campaign's name and status (always 1): join on "
                                 "campaign for names.", labels=["campaign", "name", "status"])
        counts: dict[str, dict[str, int]] = {}
        for row in reading.jobs:
            campaign = str(row["campaign_id"])
            if campaign not in counts:
                counts[campaign] = dict.fromkeys(JOB_STATUSES, 0)
                info.add_metric([campaign, row["name"], row["campaign_status"]], 1)
            counts[campaign][row["status"]] += row["jobs"]
        for campaign, by_status in counts.items():
            # Every status of every campaign, 0 included: a status that empties shows 0, not a gap.
            for status, n in by_status.items():
                jobs.add_metric([campaign, status], n)
        yield jobs
        yield info

        bounces = CounterMetricFamily("senddock_bounces", "Bounces and complaints recorded, by kind (hard, soft, "
                                      "complaint) and source (send: refused at send time; ses; mail).",
                                      labels=["kind", "source"])
        suppressions = GaugeMetricFamily("senddock_suppressions", "Addresses on the suppression list, by reason.",
                                         labels=["reason"])
        for row in reading.totals:
            if row["subject"] == "bounces" and row["n"] is not None:
                bounces.add_metric([row["kind"], row["source"]], row["n"])
            elif row["subject"] == "suppressions":
                suppressions.add_metric([row["kind"]], row["n"])
        yield bounces
        yield suppressions

        lag = GaugeMetricFamily("senddock_queue_lag_seconds", "Age of the oldest due job of a sending campaign "
                                "(0 when nothing is due).")
        lag.add_metric([], max((row["lag"] for row in reading.lag), default=0.0))
        yield lag
        by_campaign = GaugeMetricFamily("senddock_campaign_queue_lag_seconds", "Age of the oldest due job, per "
                                        "sending campaign.", labels=["campaign"])
        for row in reading.lag:
            by_campaign.add_metric([str(row["campaign_id"])], row["lag"])
        yield by_campaign

        pacing = GaugeMetricFamily("senddock_pacing_rate_per_second", "Each pacing limit's rate: configured, "
                                   "effective (adaptive pacing's factor applied) and measured (the last minute).",
                                   labels=["group", "kind"])
        for limit in reading.pacing:
            for kind, value in (("configured", None if limit.configured is None else limit.configured.per_second),
                                ("effective", limit.effective_per_second),
                                ("measured", limit.measured_per_second)):
                if value is not None:
                    pacing.add_metric([limit.key, kind], value)
        yield pacing

        took = GaugeMetricFamily("senddock_cluster_scrape_seconds", "How long reading these figures from the "
                                 "database took.")
        took.add_metric([], reading.seconds)
        yield took
