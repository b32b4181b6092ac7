"""senddock/store/schema.sql is the schema the migrations make, on every server version CI runs."""

from __future__ import annotations

import difflib
from pathlib import Path

import psycopg

from senddock.store.schema import describe

SCHEMA_FILE = Path(__file__).resolve().parents[2] / "senddock" / "store" / "schema.sql"  # the checkout's


def test_schema_sql_is_what_the_migrations_make(database_dsn: str):
    with psycopg.connect(database_dsn, autocommit=True) as conn:
        made = describe(conn)
    written = SCHEMA_FILE.read_text(encoding="utf-8")
    diff = "".join(difflib.unified_diff(written.splitlines(True), made.splitlines(True), "schema.sql", "migrations"))
    assert diff == "", ("senddock/store/schema.sql differs from what the migrations make; regenerate it with "
                        "`python -m senddock.store.schema DSN > senddock/store/schema.sql`:\n" + diff)


def test_the_file_holds_every_table_the_queries_use(database_dsn: str):
    written = SCHEMA_FILE.read_text(encoding="utf-8")
    with psycopg.connect(database_dsn, autocommit=True) as conn:
        tables = [name for (name,) in conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public' AND tablename <> 'senddock_migrations'")]
    assert len(tables) > 15
    assert [t for t in tables if f"TABLE {t} (" not in written] == []
