"""Numbered SQL migrations, applied once each, under an advisory lock so two nodes starting together don't race."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import resources

import psycopg
import structlog

from senddock.errors import DatabaseError

log = structlog.get_logger(__name__)

# pg_advisory_lock key: 'senddock' spelt in hex, held only while migrating.
MIGRATION_LOCK_KEY = 0x73656E64646F636B
_FILE = re.compile(r"^(?P<version>\d{4})_(?P<name>\w+)\.sql$")
# A migration that must not run inside a transaction (e.g. CREATE INDEX CONCURRENTLY) says so.
_NO_TRANSACTION = "-- senddock: no-transaction"


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str = field(repr=False)

    @property
    def in_transaction(self) -> bool:
        return _NO_TRANSACTION not in self.sql


def known_migrations() -> list[Migration]:
    folder = resources.files("senddock.store.sql.migrations")
    found = []
    for entry in folder.iterdir():
        match = _FILE.match(entry.name)
        if match:
            found.append(Migration(int(match["version"]), match["name"], entry.read_text(encoding="utf-8")))
    return sorted(found, key=lambda m: m.version)


def latest_version() -> int:
    return known_migrations()[-1].version


def applied_versions(conn: psycopg.Connection) -> set[int]:
    exists = conn.execute("SELECT to_regclass('senddock_migrations') IS NOT NULL").fetchone()[0]
    if not exists:
        return set()
    return {row[0] for row in conn.execute("SELECT version FROM senddock_migrations")}


def pending(conn: psycopg.Connection) -> list[Migration]:
    """Migrations not applied yet; refuses a database whose schema is newer than this senddock."""
    applied = applied_versions(conn)
    known = known_migrations()
    newest_known = known[-1].version
    if applied and max(applied) > newest_known:
        raise DatabaseError(
            f"the database schema is at version {max(applied)}, newer than this senddock knows "
            f"(up to {newest_known}): upgrade senddock before running it against this database"
        )
    return [m for m in known if m.version not in applied]


def migrate(conn: psycopg.Connection, *, lock_conn: psycopg.Connection | None = None) -> list[Migration]:
    """Apply every pending migration; returns those applied. ``conn`` must be in autocommit mode.

    Two processes never migrate at once: a session advisory lock on ``conn`` serialises them. Behind
    a pooler in transaction mode a session lock would stay with whichever server connection took it
    (and the unlock run on another), so ``lock_conn``, a second connection, holds a transaction
    lock instead, in a transaction left open (the pooler keeps its server connection) while
    ``conn`` migrates.
    """
    with _migration_lock(conn, lock_conn):
        conn.execute(
            """CREATE TABLE IF NOT EXISTS senddock_migrations (
                   version integer PRIMARY KEY,
                   name text NOT NULL,
                   applied_at timestamptz NOT NULL DEFAULT now())"""
        )
        todo = pending(conn)  # read under the lock: another node may just have applied them
        for migration in todo:
            _apply(conn, migration)
            log.debug("migration_applied", version=migration.version, name=migration.name)
        if todo:  # one line, not one per migration: a new database's first command says it once
            log.info("schema_migrated", version=todo[-1].version, applied=[m.name for m in todo])
        return todo


@contextmanager
def _migration_lock(conn: psycopg.Connection, lock_conn: psycopg.Connection | None) -> Iterator[None]:
    if lock_conn is not None:
        with lock_conn.transaction():
            lock_conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK_KEY,))
            yield
        return
    conn.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK_KEY,))
    try:
        yield
    finally:
        conn.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK_KEY,))


def _apply(conn: psycopg.Connection, migration: Migration) -> None:
    record = ("INSERT INTO senddock_migrations (version, name) VALUES (%s, %s)", (migration.version, migration.name))
    if migration.in_transaction:
        with conn.transaction():
            conn.execute(migration.sql)
            conn.execute(*record)
    else:
        for statement in _statements(migration.sql):
            conn.execute(statement)
        conn.execute(*record)


def _statements(sql: str) -> list[str]:
    """Split a no-transaction migration into statements (those files keep to one statement per ';')."""
    body = "\n".join(line for line in sql.splitlines() if not line.lstrip().startswith("--"))
    return [s.strip() for s in body.split(";") if s.strip()]
