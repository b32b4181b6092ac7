"""senddock.testing.DatabasePool: a database given back is used again only as a fresh copy of the
template would be (empty, ids from 1, no session left on it), and never when the test changed
its schema."""

from __future__ import annotations

import psycopg
import pytest

from senddock.testing import DatabasePool, with_database


@pytest.fixture
def pool(postgres_server_dsn, template_database):
    pool = DatabasePool(postgres_server_dsn, template_database)
    yield pool
    pool.close()


def connect(admin_dsn: str, name: str) -> psycopg.Connection:
    return psycopg.connect(with_database(admin_dsn, name), autocommit=True)


def test_a_database_given_back_is_used_again_empty_with_ids_from_one(pool, postgres_server_dsn):
    first = pool.take()
    with connect(postgres_server_dsn, first) as conn:
        # Only lists is written: list_members, which references it, stays empty (a TRUNCATE of
        # lists alone is refused, and the database used to be dropped for it).
        conn.execute("INSERT INTO lists (name) VALUES ('news'), ('offers')")
    pool.give_back(first)
    again = pool.take()
    with connect(postgres_server_dsn, again) as conn:
        assert conn.execute("SELECT count(*) FROM lists").fetchone() == (0,)
        assert conn.execute("INSERT INTO lists (name) VALUES ('news') RETURNING id").fetchone() == (1,)
        assert conn.execute("SELECT current_database()").fetchone()[0] == again != first  # renamed
    pool.give_back(again)
    assert len(pool._idle) == 1  # the one database, reused: never a second copy


def test_a_session_left_on_it_is_ended_and_a_changed_schema_is_not_used_again(pool, postgres_server_dsn):
    name = pool.take()
    left_open = connect(postgres_server_dsn, name)
    left_open.execute("CREATE TABLE scratch (x int)")
    pool.give_back(name)
    assert _ended(left_open)
    assert pool._idle == []  # dropped: its schema is not the template's
    with psycopg.connect(postgres_server_dsn, autocommit=True) as admin:
        assert admin.execute("SELECT count(*) FROM pg_database WHERE datname = %s", (name,)).fetchone() == (0,)


def _ended(conn: psycopg.Connection) -> bool:
    try:
        conn.execute("SELECT 1")
    except psycopg.OperationalError:
        return True
    return False
