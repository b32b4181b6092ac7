"""A commit that hangs is loud (issue 32 §3): a server whose commits wait for a synchronous standby
that does not exist (a promoted standby that kept `synchronous_standby_names`), under a running node.

On a Postgres of the test's own: the setting is the whole server's.
"""

from __future__ import annotations

import json

import psycopg
from test_node_metrics import get, samples
from tests_support import captured_logs, make_broadcast, running_node, wait_for, write_config

from senddock.api import Senddock
from senddock.loading import load_config
from senddock.core import waits
from senddock.sink import Sink, free_port
from senddock.testing import create_database, fast_settings, migrate_database


def set_synchronous_standbys(admin_dsn: str, names: str) -> None:
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(f"ALTER SYSTEM SET synchronous_standby_names = '{names}'")
        conn.execute("SELECT pg_reload_conf()")


def test_commits_waiting_for_a_missing_synchronous_standby_are_logged_not_ready_and_measured(
        own_server, tmp_path, monkeypatch):
    admin = own_server.get_uri()
    dsn = create_database(admin, "stuck")
    migrate_database(dsn)
    port = free_port("127.0.0.1")
    with Sink("127.0.0.1", 0, delay=0.1) as relay:
        settings = fast_settings(relay.port, concurrency=2, recovery={"heartbeat": "500ms", "lease": "20s"},
                                 database={"stuck_after": "1s"}, metrics={"listen": f"127.0.0.1:{port}"})
        monkeypatch.setenv("SENDDOCK_DATABASE_URL", dsn)
        app = Senddock(load_config(write_config(tmp_path, settings)))
        campaign_id = make_broadcast(app, [f"reader{i}@example.net" for i in range(40)])
        with captured_logs(waits) as logs, running_node(app.config):
            wait_for(lambda: len(relay.received) >= 4, 30, "the broadcast to be under way")
            set_synchronous_standbys(admin, "ghost")
            try:
                wait_for(lambda: get(f"http://127.0.0.1:{port}/readyz")[0] == 503, 30, "readyz to say not ready")
                wait_for(lambda: any(e["event"] == "database_waits" for e in logs), 30, "the watchdog to say so")
                _, body = get(f"http://127.0.0.1:{port}/readyz")
                problems = json.loads(body)["problems"]
                _, metrics = get(f"http://127.0.0.1:{port}/metrics")
            finally:
                set_synchronous_standbys(admin, "")
            wait_for(lambda: app.campaign_status(campaign_id).status == "finished", 60, "the broadcast to finish")
            wait_for(lambda: get(f"http://127.0.0.1:{port}/readyz")[0] == 200, 30, "readyz to be ready again")
        app.close()
    said = [e for e in logs if e["event"] == "database_waits"][0]
    assert said["log_level"] == "warning"
    assert "results" in said["statements"] and said["statements"]["results"]["seconds"] >= 1
    assert said["statements"]["results"]["wait_event"] == "IPC/SyncRep"
    assert any(p.startswith("a results statement has waited") and p.endswith("(IPC/SyncRep)") for p in problems)
    waited = {dict(k)["statement"]: v for k, v in samples(metrics, "senddock_database_wait_seconds").items()}
    assert set(waited) == {"claim", "results", "heartbeat"} and waited["results"] >= 1
    assert sorted(relay_counts(relay).values()) == [1] * 40  # nobody twice, nobody dropped


def relay_counts(relay: Sink) -> dict[str, int]:
    from collections import Counter

    return Counter(m.recipients[0] for m in relay.received)
