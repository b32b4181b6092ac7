"""Delivery from the outbox: on every ``senddock run`` node, ``concurrency`` threads per endpoint.

Each round is three short steps, none holding a transaction across the network: claim (the due
events of the endpoint, leased with SKIP LOCKED: several nodes share one outbox), POST them signed,
record what the receiver said. A node killed mid-POST leaves its events leased; once the lease
has passed another node delivers them again: at least once, never lost. The threads are daemons
on their own pooled connections: sending never waits on them, and a slow receiver slows only its
own endpoint.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
import uuid
from collections.abc import Sequence

import psycopg
import structlog

from senddock.store.db import Database
from senddock.errors import error_line
from senddock.observe.node_metrics import NodeMetrics
from senddock.store import outbox
from senddock.webhooks import signing
from senddock.webhooks.http import Reply, post
from senddock.config.webhooks import Endpoint

log = structlog.get_logger(__name__)

# How long a claim holds its events: the POST's own deadline, then as long again and a margin to
# record its result, before another node may take them (a node killed mid-POST: delivered again).
LEASE_MARGIN = 5.0
PRUNE_EVERY = 60.0
PRUNE_LIMIT = 10_000
PRUNE_ROUNDS = 100


def lease(endpoint: Endpoint) -> float:
    return 2 * endpoint.timeout + LEASE_MARGIN


def body_and_id(endpoint: Endpoint, events: Sequence[outbox.Claimed]) -> tuple[bytes, str]:
    """The POST's body and its webhook-id. One event: its object, and its own id. A batching
    endpoint (batch > 1) always gets a JSON array; the header's id then names that set of events
    (the same set, the same id), and each item carries its own id to deduplicate on."""
    items = [{"id": e.webhook_id, **e.payload} for e in events]
    if endpoint.batch == 1:
        return json.dumps(items[0], separators=(",", ":")).encode(), items[0]["id"]
    digest = hashlib.sha256(",".join(i["id"] for i in items).encode()).hexdigest()[:32]
    return json.dumps(items, separators=(",", ":")).encode(), f"batch_{digest}"


def deliver(endpoint: Endpoint, events: Sequence[outbox.Claimed]) -> Reply:
    body, msg_id = body_and_id(endpoint, events)
    return post(endpoint.url, body, signing.headers(endpoint.secrets, msg_id, int(time.time()), body),
                endpoint.timeout)


class EndpointDeliverer(threading.Thread):
    def __init__(self, endpoint: Endpoint, db: Database, *, poll_interval: float, prunes: bool = True,
                 number: int = 1, metrics: NodeMetrics | None = None) -> None:
        super().__init__(name=f"senddock-webhook-{endpoint.id}-{number}", daemon=True)
        self.endpoint = endpoint
        self._db = db
        self._poll = poll_interval
        self._stopping = threading.Event()
        self._prunes = prunes  # one thread of the endpoint's prunes its rows
        self._metrics = metrics
        self._pruned_at = 0.0
        self.delivered = 0  # events, for the run summary and tests
        self.failed = 0

    def stop(self) -> None:
        self._stopping.set()

    def run(self) -> None:
        backoff = 0.5
        while not self._stopping.is_set():
            try:
                busy = self._round()
                backoff = 0.5
            except psycopg.OperationalError as exc:
                log.warning("webhook_db_lost", endpoint=self.endpoint.id, error=error_line(exc), retry_in=backoff)
                busy, backoff = False, min(backoff * 2, 10.0)
            except Exception:  # never a dead deliverer: the next round tries again
                log.exception("webhook_deliverer_error", endpoint=self.endpoint.id, retry_in=backoff)
                busy, backoff = False, min(backoff * 2, 10.0)
            if not busy:
                self._stopping.wait(max(self._poll, backoff if backoff > 0.5 else 0))

    def _round(self) -> bool:
        """One claim, its POST, its record; True when there was something to deliver."""
        endpoint, token = self.endpoint, uuid.uuid4()
        with self._db.connection() as conn:
            if self._prunes and time.monotonic() - self._pruned_at > PRUNE_EVERY:
                self._prune(conn)
            events = outbox.claim(conn, endpoint, token, lease(endpoint))
        if not events:
            return False
        reply = deliver(endpoint, events)  # no connection held meanwhile
        ids = [e.id for e in events]
        with self._db.connection() as conn:
            if reply.error is None:
                outbox.delivered(conn, ids, reply.status)
                self.delivered += len(ids)
                self._count("delivered", len(ids))
                log.debug("webhook_delivered", endpoint=endpoint.id, events=len(ids), status=reply.status)
                return True
            if reply.gone:
                outbox.disable(conn, endpoint, f"{reply.error} at {time.strftime('%Y-%m-%d %H:%M:%SZ', time.gmtime())}")
                log.error("webhook_endpoint_disabled", endpoint=endpoint.id, url=endpoint.shown_url, error=reply.error,
                          meaning="the receiver answered 410 Gone: no more deliveries until `senddock webhooks enable`")
            states = outbox.failed(conn, endpoint, ids, token, status=reply.status, error=reply.error,
                                   retry_after=reply.retry_after)
        self.failed += len(ids)
        dead = [i for i, state in states.items() if state == "dead"]
        self._count("failed", len(ids) - len(dead))
        self._count("dead", len(dead))
        log.warning("webhook_failed", endpoint=endpoint.id, url=endpoint.shown_url, events=len(ids),
                    attempt=max(e.attempts for e in events), status=reply.status, error=reply.error,
                    dead=len(dead) or None)
        if dead:
            log.error("webhook_dead", endpoint=endpoint.id, events=dead[:20], error=reply.error,
                      meaning="not delivered within retry.max_age: kept with the error; `senddock webhooks replay`")
        return False  # a receiver that failed is not sent the next events at once

    def _count(self, outcome: str, events: int) -> None:
        if self._metrics is not None and events:
            self._metrics.webhook_events.labels(endpoint=self.endpoint.id, outcome=outcome).inc(events)

    def _prune(self, conn: psycopg.Connection) -> None:
        """Up to PRUNE_ROUNDS x PRUNE_LIMIT rows a minute, each round its own short statement
        (a busy endpoint delivers hundreds of thousands of events a minute)."""
        self._pruned_at = time.monotonic()
        pruned = expired = 0
        for _ in range(PRUNE_ROUNDS):
            deleted, died = outbox.prune(conn, self.endpoint, PRUNE_LIMIT)
            pruned, expired = pruned + deleted, expired + died
            if deleted < PRUNE_LIMIT or self._stopping.is_set():
                break
        if pruned or expired:
            log.info("webhook_outbox_pruned", endpoint=self.endpoint.id, deleted=pruned, died_disabled=expired or None)


class Webhooks:
    """The node's deliverers, ``concurrency`` per configured endpoint (none: nothing runs)."""

    def __init__(self, endpoints: Sequence[Endpoint], db: Database, *, poll_interval: float,
                 metrics: NodeMetrics | None = None) -> None:
        self.threads = [EndpointDeliverer(e, db, poll_interval=poll_interval, prunes=n == 1, number=n, metrics=metrics)
                        for e in endpoints for n in range(1, e.concurrency + 1)]
        self.endpoint_ids = [e.id for e in endpoints]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def stop(self) -> None:
        """No new claims; a POST under way is left to finish or not (its events stay leased, and
        go again). Returns at once: a node's shutdown never waits on a receiver."""
        for thread in self.threads:
            thread.stop()

    def join(self, timeout: float = 2.0) -> None:
        """Before the pool closes: give a thread that is recording a result the time to."""
        deadline = time.monotonic() + timeout
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))
