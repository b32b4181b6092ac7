"""The suppression list every campaign respects."""

from __future__ import annotations

import psycopg
import structlog
from psycopg.rows import dict_row

from senddock.store.db import Database
from senddock.store.queries import query
from senddock.mail.addresses import check_address
from senddock.outcome import SUPPRESSION_REASONS as REASONS

log = structlog.get_logger(__name__)


class Suppressions:
    """The engine's implementation of :class:`senddock.outcome.SuppressionList`."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def add(
        self,
        email: str,
        *,
        reason: str,
        code: str | None = None,
        diagnostic: str | None = None,
        broadcast_id: int | None = None,
    ) -> bool:
        if reason not in REASONS:
            raise ValueError(f"suppression reason must be one of {', '.join(REASONS)}, not {reason!r}")
        email = check_address(email)
        params = {"email": email, "reason": reason, "code": code, "diagnostic": diagnostic, "broadcast_id": broadcast_id}
        with self._db.connection() as conn:
            row = conn.execute(query("suppression_add"), params).fetchone()
        # No row: suppressed already, for as strong a reason. False: a bounce's suppression now
        # carries this stronger reason (never undone by `campaign unsuppress`).
        if row is not None:
            # The engine's suppressions (bounces, complaints, unsubscribes) are the audit trail; an
            # operator's own `suppressions add/import` is told by the command, not once per address.
            level = log.debug if reason == "manual" else log.info
            level("address_suppressed", email=email, reason=reason, code=code, broadcast_id=broadcast_id,
                     **({} if row[0] else {"replaces": "bounced"}))
        return row is not None and row[0]


def list_suppressions(conn: psycopg.Connection, *, reason: str | None = None, search: str | None = None) -> list[dict]:
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(query("suppression_list"), {"reason": reason, "search": search}).fetchall()


def remove_suppression(conn: psycopg.Connection, email: str) -> bool:
    """Future campaigns may reach the address again; nothing already failed is resent."""
    return conn.execute(query("suppression_remove"), {"email": email}).fetchone() is not None
