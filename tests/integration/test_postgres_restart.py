"""Postgres restarting under running nodes: they reconnect, keep their own claims, lose nothing."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import psycopg

from senddock.testing import create_database, fast_settings, migrate_database, restart_postgres
from tests_support import sent_count, start_node, wait_for, write_config


def test_restart_mid_broadcast_loses_nothing_and_no_node_takes_anothers_jobs(own_server, smtp_sink, tmp_path: Path):
    dsn = create_database(own_server.get_uri(), "restart_test")
    migrate_database(dsn)
    # A long lease: a node that took another's jobs after the restart would show as an in-doubt
    # attempt recorded by the wrong node.
    settings = fast_settings(smtp_sink.port, recovery={"heartbeat": "500ms", "lease": "60s"},
                             retry={"schedule": ["1s"], "max_retries": 20, "jitter": 0})
    from senddock.api import Senddock
    from senddock.loading import load_config
    from senddock.store.db import Database

    config_path = write_config(tmp_path, settings)
    config = load_config(config_path, environ={"SENDDOCK_DATABASE_URL": dsn})
    app = Senddock(config, database=Database(config.database, dsn=dsn))
    from tests_support import make_broadcast

    emails = [f"user{i}@example.com" for i in range(3000)]
    campaign_id = make_broadcast(app, emails)
    app.close()
    nodes = [start_node(config_path, dsn, name) for name in ("east", "west")]
    wait_for(lambda: sent_count(dsn) > 300, 60, "both nodes sending")
    restart_postgres(own_server)
    restarted = sent_count(dsn)
    assert restarted < 3000, "the broadcast finished before the restart; make it bigger"
    wait_for(lambda: sent_count(dsn) == 3000, 120, "the broadcast to finish after the restart")
    for node in nodes:
        node.terminate()
        _, stderr = node.communicate(timeout=60)
        assert node.returncode == 0, stderr.decode()[-3000:]
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT status FROM campaigns WHERE id = %s", (campaign_id,)).fetchone() == ("finished",)
        taken = conn.execute("SELECT count(*) FROM delivery_attempts WHERE outcome = 'in_doubt'").fetchone()[0]
        stopped = conn.execute("SELECT count(*) FROM nodes WHERE stopped_at IS NOT NULL").fetchone()[0]
    assert taken == 0, "no node may take another's jobs before its lease runs out"
    assert stopped == 2
    delivered = Counter(r.recipients[0] for r in smtp_sink.received)
    assert set(delivered) == set(emails)
    assert max(delivered.values()) == 1
