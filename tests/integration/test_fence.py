"""A node fences itself (claims nothing, starts no send) only when its heartbeats really fail, and
says so (issue 32 §5): at the shortest lease the config takes it used to fence itself between two
heartbeats on time, putting its jobs back every few seconds."""

from __future__ import annotations

import time

import psycopg
from tests_support import captured_logs, make_broadcast, running_node, still_true, wait_for

from senddock.api import Senddock
from senddock.core import claimer, completer, nodes
from senddock.core.nodes import fence_after
from senddock.sink import Sink
from senddock.testing import fast_settings


def test_the_fence_leaves_room_for_a_heartbeat_a_moment_late_at_the_shortest_lease():
    assert fence_after(heartbeat=1, lease=3) == 2  # was 1: the next heartbeat was due then
    assert fence_after(heartbeat=5, lease=30) == 20  # the defaults: as before
    assert fence_after(heartbeat=0.2, lease=1) == 0.6


def test_at_the_shortest_lease_a_node_with_healthy_heartbeats_never_fences_itself(make_config):
    with Sink("127.0.0.1", 0, delay=0.02) as relay:
        settings = fast_settings(relay.port, concurrency=5, recovery={"heartbeat": "1s", "lease": "3s"})
        app = Senddock(make_config(settings))
        campaign_id = make_broadcast(app, [f"reader{i}@example.net" for i in range(1200)])
        with captured_logs(nodes, completer, claimer) as logs, running_node(app.config):
            wait_for(lambda: app.campaign_status(campaign_id).status == "finished", 120, "the broadcast to finish")
        app.close()
    events = [e["event"] for e in logs]
    assert "node_fenced" not in events
    assert "jobs_put_back" not in events
    assert len(relay.received) == 1200


def test_a_node_whose_heartbeats_fail_fences_itself_says_so_and_resumes_when_they_pass(make_config, database_dsn):
    with Sink("127.0.0.1", 0, delay=0.02) as relay:
        settings = fast_settings(relay.port, concurrency=2, recovery={"heartbeat": "300ms", "lease": "1500ms"})
        app = Senddock(make_config(settings))
        campaign_id = make_broadcast(app, [f"reader{i}@example.net" for i in range(400)])
        with captured_logs(nodes) as logs, running_node(app.config) as node, \
                psycopg.connect(database_dsn) as blocker:
            wait_for(lambda: len(relay.received) >= 20, 30, "sending to start")
            # Its heartbeats wait for a row lock from now on: they fail to land, as on a server
            # that stopped answering the lifeline.
            blocker.execute("SELECT 1 FROM nodes WHERE id = %s FOR UPDATE", (node.node.id,))
            wait_for(lambda: any(e["event"] == "node_fenced" for e in logs), 30, "the node to fence itself")
            wait_for(lambda: node.slots.in_use == 0, 30, "its sends in flight to end")
            quiet_from = time.time()
            # Fenced for several heartbeats (300 ms) and claim polls: it starts nothing.
            received = len(relay.received)
            assert still_true(lambda: not node.lifeline.may_send() and len(relay.received) == received, 1.5)
            released_at = time.time()  # sends may begin again from here: before the log line says so
            blocker.rollback()  # the heartbeat lands
            wait_for(lambda: any(e["event"] == "node_unfenced" for e in logs), 30, "the node to say it is back")
            wait_for(lambda: app.campaign_status(campaign_id).status == "finished", 60, "the broadcast to finish")
        app.close()
    fenced = next(e for e in logs if e["event"] == "node_fenced")
    assert fenced["log_level"] == "warning" and fenced["last_heartbeat_s"] >= fenced["fence_after_s"] == 0.9
    assert [m for m in relay.received if quiet_from < m.at < released_at] == []  # nothing began while fenced
    assert sorted({m.recipients[0] for m in relay.received}) == sorted(f"reader{i}@example.net" for i in range(400))
