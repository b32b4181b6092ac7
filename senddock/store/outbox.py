"""Writing events into the outbox, in the caller's transaction, and the outbox's reads and writes
for delivery, pruning and the CLI. One access function per query."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from senddock.store.queries import query
from senddock.config.webhooks import EVENT_TYPES, Endpoint, Subscriptions


def event(kind: str, **data: Any) -> dict[str, Any]:
    """One event as webhook_emit takes it; ``kind`` is the config's name (``sent``)."""
    return {"kind": kind, "type": EVENT_TYPES[kind], "data": data}


def emit(conn: psycopg.Connection, subscriptions: Subscriptions, events: Iterable[dict[str, Any]]) -> None:
    """Write ``events`` for the endpoints subscribed to them: one statement, none at all when no
    endpoint wants any of them. Call it inside the transaction that records the facts."""
    wanted = [e for e in events if subscriptions.wants(e["kind"])]
    if wanted:
        conn.execute(query("webhook_emit"), {"events": Jsonb(wanted), **subscriptions.params()})


@dataclass(frozen=True)
class Claimed:
    id: int
    msg_id: uuid.UUID
    payload: dict[str, Any]
    attempts: int

    @property
    def webhook_id(self) -> str:
        return f"msg_{self.msg_id}"


def claim(conn: psycopg.Connection, endpoint: Endpoint, token: uuid.UUID, lease: float) -> list[Claimed]:
    rows = conn.execute(query("webhook_claim"), {"endpoint": endpoint.id, "limit": endpoint.batch,
                                                 "claim_token": token, "lease": lease}).fetchall()
    return sorted((Claimed(*row) for row in rows), key=lambda c: c.id)


def delivered(conn: psycopg.Connection, ids: Sequence[int], status: int | None) -> None:
    conn.execute(query("webhook_delivered"), {"ids": list(ids), "status": status})


def failed(conn: psycopg.Connection, endpoint: Endpoint, ids: Sequence[int], token: uuid.UUID, *,
           status: int | None, error: str, retry_after: float | None, jitter: float = 0.1) -> dict[int, str]:
    """Record a failed attempt; returns each event's status now (pending or dead)."""
    params = {"ids": list(ids), "claim_token": token, "status": status, "error": error[:1000],
              "retry_after": retry_after, "schedule": list(endpoint.schedule), "jitter": jitter,
              "max_age": endpoint.max_age}
    return dict(conn.execute(query("webhook_failed"), params).fetchall())


def disable(conn: psycopg.Connection, endpoint: Endpoint, reason: str) -> None:
    conn.execute(query("webhook_endpoint_disable"), {"endpoint": endpoint.id, "url": endpoint.shown_url,
                                                     "reason": reason})


def enable(conn: psycopg.Connection, endpoint_id: str) -> bool:
    return conn.execute(query("webhook_endpoint_enable"), {"endpoint": endpoint_id}).fetchone() is not None


def prune(conn: psycopg.Connection, endpoint: Endpoint, limit: int = 10000) -> tuple[int, int]:
    """(events deleted, pending events of a disabled endpoint that died of age)."""
    params = {"endpoint": endpoint.id, "keep_delivered": endpoint.keep_delivered, "keep_dead": endpoint.keep_dead,
              "max_age": endpoint.max_age, "limit": limit}
    return conn.execute(query("webhook_prune"), params).fetchone()


def counts(conn: psycopg.Connection) -> dict[str, dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        return {row.pop("endpoint"): row for row in cur.execute(query("webhook_counts")).fetchall()}


def disabled(conn: psycopg.Connection) -> dict[str, Mapping[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        return {row["id"]: row for row in cur.execute(query("webhook_endpoints_disabled")).fetchall()}


def failing(conn: psycopg.Connection, limit: int = 20) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(query("webhook_failing"), {"limit": limit}).fetchall()


def replay(conn: psycopg.Connection, *, id: int | None = None, msg_id: uuid.UUID | None = None,
           since: datetime | None = None) -> list[tuple[int, str, str]]:
    params = {"id": id, "msg_id": msg_id, "since": since}
    return conn.execute(query("webhook_replay"), params).fetchall()
