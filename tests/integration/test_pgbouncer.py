"""senddock behind a real PgBouncer (Debian's package, started here on a port of its own).

In transaction mode a client's transactions run on whichever server connection is free: no
prepared statement may be left on one (they were: nodes died with `prepared statement "_pg3_0"
does not exist`), and a node's lifeline must be a session of its own (`database.direct_dsn`),
or the node refuses to start, taking no lock and no job. Session mode works as a direct server does.
"""

from __future__ import annotations

import collections
import subprocess

import psycopg
import pytest
from tests_support import PgBouncer, senddock_executable, write_config

from senddock.api import Senddock
from senddock.loading import load_config
from senddock.store import migrations
from senddock.store.node_identity import LOCK_CLASS
from senddock.sink import Sink

RECIPIENTS = 2000


def prepared_through(app: Senddock, tmp_path, count: int = RECIPIENTS) -> int:
    """A list of ``count`` imported from a CSV, a campaign to it, sent: every statement through
    ``app``'s DSN (COPY into a temporary table included). Returns the campaign id."""
    csv = tmp_path / "people.csv"
    csv.write_text("email\n" + "".join(f"user{i}@example.com\n" for i in range(count)), encoding="utf-8")
    app.create_list("news")
    assert app.import_subscribers(csv, "news").imported == count
    campaign_id = app.create_campaign(name="Pooled", lists=["news"], subject="Hello", from_addr="news@example.com",
                                      text_body="Hello there")
    app.send_campaign(campaign_id)
    return campaign_id


def run_nodes(config_path, dsn: str, names=("n1", "n2"), timeout: float = 120) -> list[subprocess.CompletedProcess]:
    """``senddock run --exit-when-idle`` for each name at once; their ends."""
    import os

    env = {**os.environ, "SENDDOCK_DATABASE_URL": dsn}
    nodes = [subprocess.Popen([senddock_executable(), "run", "-c", str(config_path), "--node", name, "--exit-when-idle"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for name in names]
    ended = []
    for node in nodes:
        try:
            out, err = node.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            node.kill()
            out, err = node.communicate()
        ended.append(subprocess.CompletedProcess(node.args, node.returncode, out, err))
    return ended


def job_states(dsn: str) -> dict[str, int]:
    with psycopg.connect(dsn) as conn:
        return dict(conn.execute("SELECT status, count(*) FROM broadcast_jobs GROUP BY status").fetchall())


def advisory_locks(conn: psycopg.Connection, where: str = "true", *params) -> int:
    """Advisory locks held in this test's database (pg_locks shows every database's)."""
    return conn.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND database = "
                        f"(SELECT oid FROM pg_database WHERE datname = current_database()) AND {where}",
                        params).fetchone()[0]


def node_settings(sink: Sink, **database) -> dict:
    return {"concurrency": 50, "poll_interval": "200ms", "logging": {"level": "warning"},
            "recovery": {"heartbeat": "500ms", "lease": "3s"}, "database": database,
            "smtp": {"host": "127.0.0.1", "port": sink.port, "security": "none", "timeout": "5s"}}


@pytest.fixture
def transaction_pooler(database_dsn):
    with PgBouncer(database_dsn, mode="transaction", pool_size=4) as bouncer:
        yield bouncer


def test_two_nodes_drain_a_broadcast_through_a_transaction_pooler_with_direct_dsn(
        database_dsn, transaction_pooler, tmp_path, monkeypatch):
    pooled = transaction_pooler.dsn()
    with Sink("127.0.0.1", 0) as sink:
        path = write_config(tmp_path, node_settings(sink, direct_dsn="${DIRECT_DSN}"))
        monkeypatch.setenv("DIRECT_DSN", database_dsn)
        monkeypatch.setenv("SENDDOCK_DATABASE_URL", pooled)
        with Senddock(load_config(path)) as app:
            prepared_through(app, tmp_path)
        ended = run_nodes(path, pooled)
        assert [e.returncode for e in ended] == [0, 0], [e.stderr[-2000:] for e in ended]
        assert job_states(database_dsn) == {"sent": RECIPIENTS}
        delivered = collections.Counter(m.recipients[0] for m in sink.received)
        assert len(delivered) == RECIPIENTS and max(delivered.values()) == 1
    assert "prepared statement" not in "".join(e.stderr for e in ended)
    # The pool really went through the pooler, which ran every claim and result of both nodes.
    assert transaction_pooler.log().count("login attempt") >= 2


def test_without_direct_dsn_behind_a_transaction_pooler_a_node_refuses_to_start_and_holds_nothing(
        database_dsn, transaction_pooler, tmp_path, monkeypatch):
    pooled = transaction_pooler.dsn()
    with Sink("127.0.0.1", 0) as sink:
        path = write_config(tmp_path, node_settings(sink))
        monkeypatch.setenv("SENDDOCK_DATABASE_URL", pooled)
        with Senddock(load_config(path)) as app:
            prepared_through(app, tmp_path, count=200)
            assert app.db.transaction_pooled  # found by the probe: no prepared statement was made
        ended = run_nodes(path, pooled)
        assert sink.received == []
    for end in ended:
        assert end.returncode == 2, end.stderr[-2000:]
        assert "set database.direct_dsn" in end.stderr.lower()
        assert "Traceback" not in end.stderr
    assert job_states(database_dsn) == {"pending": 200}
    with psycopg.connect(database_dsn) as conn:
        # Refused before any lock: a session lock taken through the pooler would stay with one of
        # its server connections for good, and the node's name with it.
        assert advisory_locks(conn) == 0
        assert conn.execute("SELECT count(*) FROM nodes").fetchone()[0] == 0


def test_commands_through_a_transaction_pooler_prepare_nothing_and_migrate_under_a_lock_they_release(
        database_dsn, transaction_pooler, tmp_path, monkeypatch):
    monkeypatch.setenv("SENDDOCK_DATABASE_URL", transaction_pooler.dsn())
    path = write_config(tmp_path, {"logging": {"level": "warning"}})
    with Senddock(load_config(path)) as app, Senddock(load_config(path)) as other:
        campaign_id = prepared_through(app, tmp_path, count=10)
        for _ in range(12):
            # psycopg would prepare each of these at its fifth run, and the other client, handed
            # the same server connection in turn, would find its name taken (or missing).
            for client in (app, other):
                assert client.campaign_status(campaign_id).total == 10
                client.lists()
        assert app.migrate() == []
    with psycopg.connect(database_dsn) as conn:
        assert advisory_locks(conn, "objid = %s::oid", migrations.MIGRATION_LOCK_KEY & 0xFFFFFFFF) == 0


def test_a_direct_server_is_never_taken_for_a_pooler(database_dsn, tmp_path, monkeypatch):
    monkeypatch.setenv("SENDDOCK_DATABASE_URL", database_dsn)
    path = write_config(tmp_path, {"logging": {"level": "warning"}})
    for _ in range(10):
        with Senddock(load_config(path)) as app:
            assert not app.db.transaction_pooled


def test_two_nodes_drain_through_a_session_pooler_without_direct_dsn(database_dsn, tmp_path, monkeypatch):
    with PgBouncer(database_dsn, mode="session", pool_size=30) as bouncer, Sink("127.0.0.1", 0) as sink:
        pooled = bouncer.dsn()
        path = write_config(tmp_path, node_settings(sink))
        monkeypatch.setenv("SENDDOCK_DATABASE_URL", pooled)
        with Senddock(load_config(path)) as app:
            prepared_through(app, tmp_path, count=500)
            assert not app.db.transaction_pooled
        ended = run_nodes(path, pooled)
        assert [e.returncode for e in ended] == [0, 0], [e.stderr[-2000:] for e in ended]
        assert job_states(database_dsn) == {"sent": 500}
        assert len(sink.received) == 500
    with psycopg.connect(database_dsn) as conn:
        assert advisory_locks(conn, "classid = %s::oid", LOCK_CLASS) == 0
