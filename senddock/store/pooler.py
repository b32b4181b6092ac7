"""Whether a DSN reaches Postgres through a pooler in transaction mode.

Behind PgBouncer's ``pool_mode = transaction`` (and the poolers managed Postgres offerings put in
front), a client's consecutive transactions may run on different server connections, and one
server connection serves many clients in turn. Session state then belongs to whoever ran the
statement: psycopg's server-side prepared statements (``_pg3_0``...) land on other clients'
connections, and a session advisory lock is held by a server connection that keeps it after the
client is gone. ``SHOW pool_mode`` is PgBouncer's admin console only, so the test is behavioural.

:func:`shares_sessions`: in each round the first client runs a statement (its server connection
goes back to the pooler, first in line), then a second client opens a transaction (which pins
the server connection it is handed), then the first client asks again which backend answers it.
On a direct (or session-pooled) connection the two are different sessions and the first
client's backend never changes. Through a transaction pooler, either the second client is handed
the first one's server connection (PgBouncer reuses the most recently released first) or the
first client is moved to another (round robin). Other clients of the pooler may take that server
connection in between and hide it for a round, never for long: rounds repeat.
"""

from __future__ import annotations

from collections.abc import Callable

import psycopg

# Rounds of the probe: one shows PgBouncer (LIFO or round robin) when nobody else uses it; more
# for when other clients take the server connections in between.
ROUNDS = 5


def backend_pid(conn: psycopg.Connection) -> int:
    return conn.execute("SELECT pg_backend_pid()").fetchone()[0]


def shares_sessions(conn: psycopg.Connection, connect: Callable[[], psycopg.Connection]) -> bool:
    """True when ``conn``'s session is not its own: its statements may run on a server connection
    another client also uses. ``connect`` opens a second connection through the same DSN (in
    autocommit mode); it is closed before this returns."""
    first = backend_pid(conn)
    with connect() as other:
        for _ in range(ROUNDS):
            if backend_pid(conn) != first:
                return True
            with other.transaction():
                # The open transaction pins the server connection `other` was handed.
                if backend_pid(other) == first or backend_pid(conn) != first:
                    return True
    return False
