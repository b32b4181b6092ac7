"""A node's /metrics, /healthz and /readyz (issue 16 §1): after a drain with sends that went out,
bounced and were retried, its counters equal the attempts the database recorded, outcome by
outcome; health answers while it runs; readiness says why not when the database is gone."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families
from tests_support import database_away, make_broadcast, running_node, wait_for

from senddock.api import Senddock
from senddock.sink import FailRule, Sink, free_port
from senddock.testing import fast_settings

EMAILS = [f"reader{i}@example.net" for i in range(12)] + ["bounce1@example.net", "bounce2@example.net",
                                                          "later@example.net"]


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()
    except urllib.error.URLError:
        return 0, ""  # not listening (yet)


def samples(text: str, name: str) -> dict[tuple, float]:
    """{sorted label items: value} of one metric's samples."""
    return {tuple(sorted(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples if s.name == name}


def test_counters_equal_the_database_after_a_drain_and_health_answers(make_config):
    port = free_port("127.0.0.1")
    rules = [FailRule.parse("bounce*@*=550 5.1.1 no such user"), FailRule.parse("later@*=452 4.2.2 mailbox full")]
    with Sink("127.0.0.1", 0, rules=rules) as relay:
        settings = fast_settings(relay.port)
        settings["metrics"] = {"listen": f"127.0.0.1:{port}"}
        app = Senddock(make_config(settings))
        campaign_id = make_broadcast(app, EMAILS)
        with running_node(app.config) as node:
            wait_for(lambda: app.campaign_status(campaign_id).status == "finished", 60, "the broadcast to finish")
            wait_for(lambda: not node.aftercare.busy, 10, "the aftercare")
            status, text = get(f"http://127.0.0.1:{port}/metrics")
            assert status == 200
            assert get(f"http://127.0.0.1:{port}/healthz") == (200, json.dumps({"status": "ok"}))
            ready = get(f"http://127.0.0.1:{port}/readyz")
            assert ready[0] == 200 and json.loads(ready[1]) == {"status": "ready", "problems": []}
    with app.db.connection() as conn:
        recorded = dict(conn.execute("SELECT outcome, count(*) FROM delivery_attempts GROUP BY outcome").fetchall())
    counted = {dict(labels)["outcome"]: value for labels, value in samples(text, "senddock_sends_total").items()}
    assert counted == {outcome: float(n) for outcome, n in recorded.items()}
    assert counted["sent"] == 12 and counted["bounce"] == 2 and counted["retry"] >= 1
    assert {dict(k)["transport"] for k in samples(text, "senddock_sends_total")} == {"smtp"}
    assert samples(text, "senddock_send_duration_seconds_count")[(("transport", "smtp"),)] == sum(recorded.values())
    assert samples(text, "senddock_claim_duration_seconds_count")[()] >= 1
    assert samples(text, "senddock_sends_in_flight")[()] == 0
    assert samples(text, "senddock_in_doubt_total")[()] == 0
    [(labels, value)] = samples(text, "senddock_node_info").items()
    assert value == 1 and dict(labels)["node"] == node.node.name
    app.close()


def test_readyz_says_why_not_when_the_database_is_gone(make_config, database_dsn):
    port = free_port("127.0.0.1")
    with Sink("127.0.0.1", 0) as relay:
        settings = fast_settings(relay.port)
        settings["metrics"] = {"listen": f"127.0.0.1:{port}"}
        app = Senddock(make_config(settings))
        app.ensure_schema()
        with running_node(app.config):
            wait_for(lambda: get(f"http://127.0.0.1:{port}/readyz")[0] == 200, 30, "the node to be ready")
            with database_away(database_dsn):
                wait_for(lambda: get(f"http://127.0.0.1:{port}/readyz")[0] == 503, 30, "readyz to say not ready")
                status, body = get(f"http://127.0.0.1:{port}/readyz")
                assert json.loads(body)["status"] == "not ready"
                assert any(p.startswith("database unreachable") for p in json.loads(body)["problems"])
                assert get(f"http://127.0.0.1:{port}/healthz")[0] == 200  # alive, only not ready
    app.close()
