from __future__ import annotations

import threading
import uuid

import psycopg
import pytest
from structlog.testing import capture_logs

from senddock.api import Senddock
from senddock.store import migrations
from senddock.errors import DatabaseError
from senddock.testing import create_database, drop_database


@pytest.fixture
def empty_dsn(postgres_server_dsn: str):
    name = "senddock_empty_" + uuid.uuid4().hex[:12]
    dsn = create_database(postgres_server_dsn, name)
    yield dsn
    drop_database(postgres_server_dsn, name)


def test_migrate_is_idempotent_and_recorded(empty_dsn: str):
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        assert [m.version for m in migrations.migrate(conn)] == [m.version for m in migrations.known_migrations()]
        assert migrations.migrate(conn) == []
        assert migrations.applied_versions(conn) == {m.version for m in migrations.known_migrations()}


def test_a_new_database_is_migrated_with_one_line_of_log(empty_dsn: str):
    with psycopg.connect(empty_dsn, autocommit=True) as conn, capture_logs() as logs:
        migrations.migrate(conn)
        migrations.migrate(conn)  # nothing to do: nothing said
    said = [entry for entry in logs if entry["log_level"] != "debug"]
    known = migrations.known_migrations()
    assert said == [{"event": "schema_migrated", "log_level": "info", "version": known[-1].version,
                     "applied": [m.name for m in known]}]


def test_two_nodes_migrating_at_once_do_not_race(empty_dsn: str):
    results, failures = [], []

    def run():
        try:
            with psycopg.connect(empty_dsn, autocommit=True) as conn:
                results.append(len(migrations.migrate(conn)))
        except Exception as exc:  # pragma: no cover - the assertion below shows it
            failures.append(exc)

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    assert sorted(results) == [0, 0, len(migrations.known_migrations())]


def test_a_database_newer_than_this_senddock_is_refused(database_dsn: str, make_config):
    with psycopg.connect(database_dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO senddock_migrations (version, name) VALUES (9999, 'from_the_future')")
    with Senddock(make_config()) as sd, pytest.raises(DatabaseError, match="newer than this senddock knows"):
        sd.lists()


def test_auto_migrate_false_refuses_an_unmigrated_database(empty_dsn: str, make_config, monkeypatch):
    monkeypatch.setenv("SENDDOCK_DATABASE_URL", empty_dsn)
    with Senddock(make_config({"database": {"auto_migrate": False}})) as sd:
        with pytest.raises(DatabaseError, match="run `senddock migrate`"):
            sd.lists()
    with Senddock(make_config()) as sd:  # auto_migrate defaults to true
        assert sd.lists() == []


def test_claim_indexes_are_partial_on_claimable_rows(database_dsn: str):
    with psycopg.connect(database_dsn) as conn:
        pending, retry = (conn.execute("SELECT indexdef FROM pg_indexes WHERE indexname = %s", (name,)).fetchone()[0]
                          for name in ("broadcast_jobs_pending_idx", "broadcast_jobs_retry_idx"))
        # The storage settings are each broadcast's partition's (migration 20): a partitioned table has no heap.
        campaign = conn.execute("INSERT INTO campaigns (name, subject, from_addr, text_body) "
                                "VALUES ('x', 's', 'a@example.com', 'x') RETURNING id").fetchone()[0]
        broadcast = conn.execute("INSERT INTO broadcasts (campaign_id) VALUES (%s) RETURNING id", (campaign,)).fetchone()[0]
        options = conn.execute("SELECT reloptions FROM pg_class WHERE relname = %s",
                               (f"broadcast_jobs_b{broadcast}",)).fetchone()[0]
        fks = conn.execute(
            "SELECT count(*) FROM pg_constraint WHERE conrelid = 'broadcast_jobs'::regclass AND contype = 'f'"
        ).fetchone()[0]
    assert pending.endswith("(broadcast_id, next_attempt_at, id) WHERE (status = 'pending'::text)")
    assert retry.endswith("(broadcast_id, next_attempt_at) WHERE (status = 'retry'::text)")
    assert "fillfactor=70" in options
    assert fks == 0
