"""What `senddock webhooks` shows and does: each endpoint with its counts and state, the events
failing lately, replaying events, turning an endpoint back on."""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import psycopg

from senddock.errors import InvalidInput, NotFound
from senddock.store import outbox
from senddock.config.webhooks import endpoint_id, endpoints

_MSG_ID = re.compile(r"^msg_(?P<uuid>[0-9a-f-]{36})$")


def status(conn: psycopg.Connection, config_data: Mapping[str, Any], *, failing: int = 20) -> dict[str, Any]:
    """Every configured endpoint, and any the outbox still has rows for that no longer is."""
    counts = outbox.counts(conn)
    off = outbox.disabled(conn)
    rows = []
    zero = {"pending": 0, "failing": 0, "delivered": 0, "dead": 0, "oldest_pending": None}
    for endpoint in endpoints(config_data):
        rows.append({"id": endpoint.id, "url": endpoint.shown_url, "configured": True, "events": list(endpoint.events),
                     "batch": endpoint.batch, **_state(off.get(endpoint.id)), **counts.get(endpoint.id, zero)})
    known = {row["id"] for row in rows}
    for gone in sorted(set(counts) - known):
        url = off[gone]["url"] if gone in off else None
        rows.append({"id": gone, "url": url, "configured": False, "events": [], "batch": None,
                     **_state(off.get(gone)), **counts[gone]})
    return {"endpoints": rows, "failing": outbox.failing(conn, failing)}


def _state(disabled: Mapping[str, Any] | None) -> dict[str, Any]:
    if disabled is None:
        return {"disabled": False, "disabled_at": None, "disabled_reason": None}
    return {"disabled": True, "disabled_at": disabled["disabled_at"], "disabled_reason": disabled["disabled_reason"]}


def replay(conn: psycopg.Connection, *, event: str | None = None, since: datetime | None = None) -> list[dict[str, Any]]:
    """Put delivered or dead events back in line: one by its outbox id or webhook-id (msg_...),
    or all since a time. An event still pending is left as it is (it goes already)."""
    if event is not None:
        found = _MSG_ID.match(event)
        if found:
            replayed = outbox.replay(conn, msg_id=uuid.UUID(found["uuid"]))
        elif event.isdigit() and int(event) > 0:
            replayed = outbox.replay(conn, id=int(event))
        else:
            raise InvalidInput(f"{event!r} is not an event: give its id (a number, as `webhooks ls` shows it) "
                               "or its webhook-id (msg_...)")
        if not replayed:
            raise NotFound(f"no delivered or dead event {event} (a pending one is being delivered already; "
                           "delivered ones are pruned after keep_delivered)")
    else:
        replayed = outbox.replay(conn, since=since)
    return [{"id": id, "endpoint": endpoint, "type": type} for id, endpoint, type in replayed]


def enable(conn: psycopg.Connection, config_data: Mapping[str, Any], which: str) -> str:
    """Deliver to an endpoint its receiver had turned off (410) again; ``which``: its id or URL."""
    target = which if re.fullmatch(r"[0-9a-f]{16}", which) else endpoint_id(which)
    if not outbox.enable(conn, target):
        raise NotFound(f"no disabled webhook endpoint {which} (`senddock webhooks ls` shows the disabled ones)")
    return target
