"""The cluster's /metrics on `senddock serve` (issue 16 §1): the tallies the triggers keep equal
the rows, through every way a job, an event or a suppression changes; after a drain by two nodes,
serve's figures and the nodes' counters equal the database's; /metrics is refused to strangers."""

from __future__ import annotations

import urllib.request

import psycopg
from prometheus_client.parser import text_string_to_metric_families
from tests_support import asgi_request, make_broadcast, running_node, wait_for

from senddock.api import Senddock
from senddock.sink import FailRule, Sink, free_port
from senddock.testing import fast_settings
from senddock.web.serve import create_app

TOKEN = "a-metrics-token-for-the-tests"
# More than one node claims at once (slots and deck: 8 + 32 at concurrency 4, see inflight.DECK_FLOOR),
# so both nodes take a share of the broadcast.
READERS = [f"reader{i}@example.net" for i in range(100)]
BOUNCERS = ["bounce1@example.net", "bounce2@example.net"]


def samples(text: str, name: str) -> dict[tuple, float]:
    return {tuple(sorted(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples if s.name == name}


def tallied(conn: psycopg.Connection, subject: str) -> dict[tuple, int]:
    rows = conn.execute("SELECT key, sum(n) FROM tallies WHERE subject = %s GROUP BY key HAVING sum(n) <> 0",
                        (subject,)).fetchall()
    return {tuple(key): int(n) for key, n in rows}


def counted(conn: psycopg.Connection) -> dict[str, dict[tuple, int]]:
    """What the tallies should say, counted the slow way."""
    jobs = conn.execute("SELECT tallies_job_key(j), count(*) FROM broadcast_jobs j GROUP BY 1").fetchall()
    bounces = conn.execute("SELECT tallies_event_key(e), count(*) FROM delivery_events e "
                           "WHERE kind IN ('bounce', 'complaint') GROUP BY 1").fetchall()
    suppressions = conn.execute("SELECT reason, count(*) FROM suppressions GROUP BY 1").fetchall()
    return {"jobs": {tuple(k): n for k, n in jobs}, "bounces": {tuple(k): n for k, n in bounces},
            "suppressions": {(k,): n for k, n in suppressions}}


def assert_tallies_true(app: Senddock) -> None:
    with app.db.connection() as conn:
        truth = counted(conn)
        for subject, expected in truth.items():
            assert tallied(conn, subject) == expected, subject


def scrape(app: Senddock, *, client: str = "127.0.0.1", headers=()) -> tuple[int, str]:
    sent = asgi_request(create_app(app.config, app.db), "GET", "/metrics", headers=headers, client=client)
    return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:]).decode()


def test_tallies_follow_every_change_and_fold_to_one_row_per_key(make_config):
    rules = [FailRule.parse("bounce*@*=550 5.1.1 no such user")]
    with Sink("127.0.0.1", 0, rules=rules) as relay:
        app = Senddock(make_config(fast_settings(relay.port)))
        drained = make_broadcast(app, READERS + BOUNCERS)
        with running_node(app.config) as node:
            wait_for(lambda: app.campaign_status(drained).status == "finished", 60, "the broadcast to finish")
            wait_for(lambda: not node.aftercare.busy, 10, "the aftercare")
        assert_tallies_true(app)
        # Jobs put back, failed by a cancel, deleted with their campaign; suppressions added and removed.
        cancelled = make_broadcast(app, [f"other{i}@example.org" for i in range(7)])
        app.cancel_campaign(cancelled)
        deleted = make_broadcast(app, [f"gone{i}@example.org" for i in range(5)])
        app.cancel_campaign(deleted)
        app.delete_campaign(deleted, force=True)
        app.suppress("manual@example.org")
        app.unsuppress("bounce1@example.net")
        assert_tallies_true(app)
    from senddock.store.jobs import JobQueue

    with app.db.connection() as conn:  # the node's sessions ended: their rows fold into shard 0
        before = conn.execute("SELECT count(*) FROM tallies").fetchone()[0]
        assert JobQueue(conn, node.node).fold_tallies() > 0
        assert conn.execute("SELECT count(*) FROM tallies WHERE shard <> 0 "
                            "AND shard NOT IN (SELECT pid FROM pg_stat_activity)").fetchone()[0] == 0
        assert conn.execute("SELECT count(*) FROM tallies WHERE shard = 0 AND n = 0").fetchone()[0] == 0
        after = conn.execute("SELECT count(*) FROM tallies").fetchone()[0]
    assert after < before
    assert_tallies_true(app)
    app.close()


def test_a_drain_by_two_nodes_shows_in_metrics_as_in_the_database(make_config, monkeypatch):
    monkeypatch.setenv("METRICS_TOKEN", TOKEN)
    ports = [free_port("127.0.0.1"), free_port("127.0.0.1")]
    rules = [FailRule.parse("bounce*@*=550 5.1.1 no such user")]
    # Each send takes 20 ms, so both nodes are still claiming when the first has taken its share.
    with Sink("127.0.0.1", 0, rules=rules, delay=0.02) as relay:
        settings = fast_settings(relay.port, concurrency=4)
        settings["serve"] = {"metrics": {"allow": [], "token": "${METRICS_TOKEN}"}}
        app = Senddock(make_config(settings))
        campaign_id = make_broadcast(app, READERS + BOUNCERS)
        configs = []
        for i, port in enumerate(ports):
            configs.append(make_config({**settings, "serve": {}, "metrics": {"listen": f"127.0.0.1:{port}"}},
                                       name=f"node{i}.yaml"))
        app.pause_campaign(campaign_id)  # both nodes up before any claim: both take a share
        with running_node(configs[0], node_name="one") as first, running_node(configs[1], node_name="two") as second:
            app.resume_campaign(campaign_id)
            wait_for(lambda: app.campaign_status(campaign_id).status == "finished", 60, "the broadcast to finish")
            wait_for(lambda: not first.aftercare.busy and not second.aftercare.busy, 10, "the aftercare")
            node_texts = [urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
                          for port in ports]
        status, text = scrape(app, headers=[(b"authorization", f"Bearer {TOKEN}".encode())])
    assert status == 200, text
    with app.db.connection() as conn:
        by_status = dict(conn.execute("SELECT j.status, count(*) FROM broadcast_jobs j JOIN broadcasts b "
                                      "ON b.id = j.broadcast_id WHERE b.campaign_id = %s GROUP BY 1",
                                      (campaign_id,)).fetchall())
        attempts = dict(conn.execute("SELECT outcome, count(*) FROM delivery_attempts GROUP BY 1").fetchall())
        suppressions = dict(conn.execute("SELECT reason, count(*) FROM suppressions GROUP BY 1").fetchall())
        by_node = dict(conn.execute("SELECT node, count(*) FROM delivery_attempts GROUP BY 1").fetchall())
    assert set(by_node) == {"one", "two"}, "both nodes sent"
    jobs = {dict(k)["status"]: v for k, v in samples(text, "senddock_jobs").items() if dict(k)["campaign"] == str(campaign_id)}
    assert jobs == {status: float(by_status.get(status, 0)) for status in ("pending", "sending", "retry", "sent", "failed")}
    assert jobs["sent"] == len(READERS) and jobs["failed"] == len(BOUNCERS)
    assert samples(text, "senddock_bounces_total") == {(("kind", "hard"), ("source", "send")): float(len(BOUNCERS))}
    assert samples(text, "senddock_suppressions") == {(("reason", r),): float(n) for r, n in suppressions.items()}
    assert samples(text, "senddock_queue_lag_seconds") == {(): 0.0}  # nothing sending any more
    assert samples(text, "senddock_cluster_up") == {(): 1.0}
    [(info, one)] = samples(text, "senddock_campaign_info").items()
    assert one == 1 and dict(info)["status"] == "finished"
    # The nodes' counters, summed over both, equal the attempts recorded, outcome by outcome.
    summed: dict[str, float] = {}
    for node_text in node_texts:
        for labels, value in samples(node_text, "senddock_sends_total").items():
            summed[dict(labels)["outcome"]] = summed.get(dict(labels)["outcome"], 0) + value
    assert summed == {outcome: float(n) for outcome, n in attempts.items()}
    assert summed["sent"] == len(READERS)
    app.close()


def test_queue_lag_is_the_age_of_the_oldest_due_job(make_config):
    app = Senddock(make_config(fast_settings(1)))
    campaign_id = make_broadcast(app, READERS[:3])
    with app.db.connection() as conn:
        conn.execute("UPDATE broadcast_jobs SET next_attempt_at = now() - interval '90 seconds'")
        conn.execute("UPDATE broadcast_jobs SET status = 'retry', next_attempt_at = now() - interval '600 seconds' "
                     "WHERE email = %s", (READERS[2],))
    status, text = scrape(app)
    assert status == 200
    lag = samples(text, "senddock_campaign_queue_lag_seconds")[(("campaign", str(campaign_id)),)]
    assert 600 <= lag < 660
    assert samples(text, "senddock_queue_lag_seconds")[()] == lag
    app.pause_campaign(campaign_id)  # only sending campaigns are lagging
    app.config.section("serve")["metrics"]["min_interval"] = "0s"
    status, text = scrape(app)
    assert samples(text, "senddock_queue_lag_seconds") == {(): 0.0}
    assert samples(text, "senddock_campaign_queue_lag_seconds") == {}
    app.close()


def test_metrics_are_refused_to_strangers_and_say_so_when_the_database_is_down(make_config, monkeypatch):
    monkeypatch.setenv("METRICS_TOKEN", TOKEN)
    app = Senddock(make_config(fast_settings(1, serve={"metrics": {"allow": ["10.1.0.0/16"],
                                                                    "token": "${METRICS_TOKEN}"}})))
    app.ensure_schema()
    assert scrape(app, client="127.0.0.1")[0] == 403  # the loopback is not in this allow list
    assert scrape(app, client="203.0.113.9")[0] == 403
    assert scrape(app, client="203.0.113.9", headers=[(b"authorization", b"Bearer wrong-token-wrong-token")])[0] == 403
    assert scrape(app, client="10.1.2.3")[0] == 200
    assert scrape(app, client="203.0.113.9", headers=[(b"authorization", f"Bearer {TOKEN}".encode())])[0] == 200
    app.close()
    monkeypatch.setenv("SENDDOCK_DATABASE_URL", f"postgresql://nobody@127.0.0.1:{free_port('127.0.0.1')}/none")
    down = Senddock(make_config(fast_settings(1, database={"connect_timeout": "1s"}), name="down.yaml"))
    status, text = scrape(down)
    assert status == 200
    assert samples(text, "senddock_cluster_up") == {(): 0.0}
    assert samples(text, "senddock_jobs") == {}
