"""Done when (issue 16 §2): a receiver that fails now and then, a node killed with kill -9 in the
middle of a drain, a second node that finishes: every event arrives at least once, validly signed."""

from __future__ import annotations

import signal
from collections import Counter
from pathlib import Path

import standardwebhooks

from senddock.api import Senddock
from senddock.testing import fast_settings
from tests_support import make_broadcast, sent_count, start_node, wait_for, write_config
from webhook_receiver import SECRET, Answer, Receiver


def flaky(n: int, body: bytes) -> Answer:
    """Every 5th POST answers 500, every 23rd hangs past the client's timeout."""
    if n % 5 == 0:
        return Answer(500, b"flaky")
    if n % 23 == 0:
        return Answer(503, delay=3)  # never seen: the client has given up by then
    return Answer()


def test_kill_9_mid_drain_loses_no_event(make_config, database_dsn, smtp_sink, tmp_path: Path, monkeypatch):
    monkeypatch.setenv("SENDDOCK_WEBHOOK_SECRET", SECRET)
    with Receiver(flaky) as receiver:
        # Logging at error: each failed POST is a warning, and the nodes' stderr is a pipe read at the end.
        settings = fast_settings(smtp_sink.port, recovery={"heartbeat": "200ms", "lease": "1s"},
                                 logging={"level": "error"}, webhooks=[{
            "url": receiver.url, "secret": "${SENDDOCK_WEBHOOK_SECRET}", "events": ["sent", "campaign_finished"],
            "timeout": "1s", "retry": {"schedule": ["200ms", "500ms"]}}])
        app = Senddock(make_config(settings))
        emails = [f"user{i}@example.com" for i in range(500)]
        campaign_id = make_broadcast(app, emails)
        config_path = write_config(tmp_path, settings)

        first = start_node(config_path, database_dsn, "first")
        wait_for(lambda: len(receiver.accepted()) >= 10 or first.poll() is not None, 60, "deliveries under way")
        first.send_signal(signal.SIGKILL)
        assert first.wait(10) == -signal.SIGKILL, "the node had stopped before the kill"
        sent_at_kill = sent_count(database_dsn)
        with app.db.connection() as conn:
            pending, leased = conn.execute(
                "SELECT count(*), count(*) FILTER (WHERE attempts > 0 AND next_attempt_at > now()) "
                "FROM webhook_outbox WHERE status = 'pending'").fetchone()
        assert pending > 0, "the outbox was drained before the kill: the test proves nothing"
        second = start_node(config_path, database_dsn, "second")
        try:
            wait_for(lambda: app.campaign_status(campaign_id).status == "finished" and outbox_left(app) == 0, 120,
                     "the campaign to finish and every event to be delivered")
        finally:
            second.send_signal(signal.SIGTERM)
            _, stderr = second.communicate(timeout=60)
        assert second.returncode == 0, stderr.decode()[-2000:]

        verifier = standardwebhooks.Webhook(SECRET)
        for request in receiver.accepted():
            verifier.verify(request.body, request.headers)  # raises on a bad signature
        failures = [r for r in receiver.requests if r.answered != 200]
        received = receiver.events()
    assert failures, "the receiver never failed: the test proves nothing"
    with app.db.connection() as conn:
        written = {f"msg_{row[0]}" for row in conn.execute("SELECT msg_id FROM webhook_outbox")}
    assert written <= {e["id"] for e in received}, "an event written was never accepted"
    assert {e["data"]["email"] for e in received if e["type"] == "message.sent"} == set(emails)
    assert Counter(e["type"] for e in received)["campaign.finished"] >= 1
    print(f"sent_at_kill={sent_at_kill} pending_at_kill={pending} leased_at_kill={leased} "
          f"requests={len(receiver.requests)} failed={len(failures)} events_written={len(written)} "
          f"events_received={len(received)}")
    app.close()


def outbox_left(app) -> int:
    with app.db.connection() as conn:
        return conn.execute("SELECT count(*) FROM webhook_outbox WHERE status <> 'delivered'").fetchone()[0]
