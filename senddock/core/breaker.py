"""Breakers: stop a campaign before one fault damages a whole list, and resume it when that is safe.

* **Consecutive failures** that no recipient caused (``transport.max_consecutive_failures``)
  pause the campaign. Only a delivery ends a run: a bounce proves nothing about the relay, so it
  neither adds to the run nor ends it; throttling is neither. When relay trouble alone filled the
  run (no connection, timeouts, the relay's own X.3/X.4 failures), the pause resumes by itself:
  the :class:`Prober` probes the relay with backoff and resumes once it answers. Any other run
  (policy refusals, generic rejections) waits for a person.
* The **bounce-rate breaker** (``breaker.bounce_rate``): more than that share of the last results,
  or too many of the first ones, are hard bounces. A relay saying "user unknown" for everyone must
  not suppress a list: the campaign pauses (reason ``bounce_rate``), its bounces' hooks wait, and
  ``campaign unsuppress ID --since-pause`` undoes the suppressions of the window that tripped it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import psycopg
import structlog

from senddock.config import Config
from senddock.store.db import Database
from senddock.store.jobs import JobQueue
from senddock.core.results import describe
from senddock.errors import error_line
from senddock.outcome import Classification, Outcome, SendResult

log = structlog.get_logger(__name__)

# The paused_reason of a pause for relay trouble; the details follow after ": ".
RELAY_UNAVAILABLE = "relay_unavailable"


@dataclass
class _Run:
    failures: int = 0
    relay_only: bool = True  # every failure of the run was relay trouble


@dataclass(frozen=True)
class Trip:
    reason: str
    auto_resume: bool


class FailureRuns:
    """Per campaign, this node's current run of failures no recipient caused."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._runs: dict[int, _Run] = {}
        self._lock = threading.Lock()

    def track(self, campaign_id: int, verdict: Classification) -> Trip | None:
        """Count one classified result; a Trip when the run just reached the limit."""
        with self._lock:
            if verdict.outcome is Outcome.SENT:
                self._runs.pop(campaign_id, None)
                return None
            counts = verdict.outcome in (Outcome.RETRY, Outcome.FAIL) and not verdict.about_recipient \
                and not verdict.throttled
            if not counts:
                return None
            run = self._runs.setdefault(campaign_id, _Run())
            run.failures += 1
            run.relay_only = run.relay_only and verdict.relay_trouble
            if run.failures < self._limit:
                return None
            del self._runs[campaign_id]
        what = f"{self._limit} consecutive failures: {verdict.reason}"
        if run.relay_only:
            return Trip(f"{RELAY_UNAVAILABLE}: {what}", auto_resume=True)
        return Trip(what, auto_resume=False)

    def forget(self, campaign_id: int) -> None:
        with self._lock:
            self._runs.pop(campaign_id, None)


def probe(config: Config) -> SendResult | None:
    """Ask the transport's plugin whether its relay answers; None when no plugin can tell."""
    pm = config.plugin_manager
    try:
        return pm.hook.probe_transport(transport=config.transport, config=config)
    except Exception as exc:  # a plugin's bug is a failed probe, never a dead prober
        return SendResult.from_exception(config.transport, exc, phase="probe")


class Prober(threading.Thread):
    """Probes the relay of campaigns paused for relay trouble, each when its probe is due, and
    resumes those whose relay answers. Every node runs one; a due probe is taken by one node."""

    def __init__(self, config: Config, db: Database, queue_for, stopping: threading.Event, wake) -> None:
        super().__init__(name="senddock-prober", daemon=True)
        self._config = config
        self._db = db
        self._queue_for = queue_for
        self._stopping = stopping
        self._wake = wake

    def run(self) -> None:
        while not self._stopping.wait(self._config.poll_interval):
            try:
                self.probe_due()
            except psycopg.OperationalError as exc:
                log.warning("prober_db_lost", error=error_line(exc))
            except Exception:
                log.exception("prober_error")

    def probe_due(self) -> int:
        """Probe every campaign whose probe is due now; returns how many resumed."""
        breaker = self._config.breaker
        resumed = 0
        while not self._stopping.is_set():
            with self._db.connection() as conn:
                due = self._queue_for(conn).probe_due(breaker.probe_interval, breaker.probe_max_interval)
            if due is None:
                return resumed
            campaign_id, probes, reason = due
            result = probe(self._config)  # outside any transaction: it may take the transport's timeout
            with self._db.connection() as conn:
                queue: JobQueue = self._queue_for(conn)
                if result is None or result.ok:
                    answer = "no probe for this transport: resumed as a trial" if result is None else describe(result)
                    if queue.auto_resume(campaign_id, answer):
                        resumed += 1
                        log.warning("campaign_resumed", campaign_id=campaign_id, by="probe", probes=probes,
                                    probe=answer, paused_reason=reason)
                        self._wake()
                else:
                    answer = describe(result)
                    queue.probe_failed(campaign_id, answer)
                    log.info("relay_probe_failed", campaign_id=campaign_id, probes=probes, probe=answer)
        return resumed
