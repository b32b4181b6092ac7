"""Outgoing webhooks: events written with their facts, delivered signed, at least once."""

from __future__ import annotations

import pytest
import standardwebhooks

from senddock.api import Senddock
from senddock.testing import drain, fast_settings
from tests_support import make_broadcast, running_node
from webhook_receiver import SECRET, Answer, Receiver

ALL_EVENTS = ["sent", "bounced", "complained", "unsubscribed", "campaign_finished", "campaign_paused"]


def hook(url: str, **options) -> dict:
    return {"url": url, "secret": "${SENDDOCK_WEBHOOK_SECRET}", "events": ALL_EVENTS, **options}


@pytest.fixture(autouse=True)
def webhook_secret(monkeypatch):
    monkeypatch.setenv("SENDDOCK_WEBHOOK_SECRET", SECRET)


def verified(receiver: Receiver) -> list[dict]:
    """Every accepted request checked by the Standard Webhooks library itself; their events."""
    verifier = standardwebhooks.Webhook(SECRET)
    events = []
    for request in receiver.accepted():
        parsed = verifier.verify(request.body, request.headers)
        events += parsed if isinstance(parsed, list) else [parsed]
    return events


def outbox(app) -> list[tuple]:
    with app.db.connection() as conn:
        return conn.execute("SELECT type, status, attempts, last_error FROM webhook_outbox ORDER BY id").fetchall()


def test_every_send_and_the_finish_are_delivered_signed(make_config, smtp_sink):
    with Receiver() as receiver:
        config = make_config(fast_settings(smtp_sink.port, webhooks=[hook(receiver.url)]))
        app = Senddock(config)
        emails = [f"user{i}@example.com" for i in range(30)]
        campaign_id = make_broadcast(app, emails)
        drain(config)
        receiver.wait_for(lambda r: len(r.events()) >= 31, 30, "31 events")
        events = verified(receiver)
    sent = [e for e in events if e["type"] == "message.sent"]
    assert sorted(e["data"]["email"] for e in sent) == sorted(emails)
    assert {e["data"]["campaign_id"] for e in sent} == {campaign_id}
    finished = [e for e in events if e["type"] == "campaign.finished"]
    assert [e["data"]["campaign_id"] for e in finished] == [campaign_id]
    assert all(e["id"].startswith("msg_") and e["timestamp"].endswith("Z") for e in events)
    assert {status for _, status, _, _ in outbox(app)} == {"delivered"}
    app.close()


def test_without_webhooks_nothing_is_written(make_config, smtp_sink):
    config = make_config(fast_settings(smtp_sink.port))
    app = Senddock(config)
    make_broadcast(app, ["a@example.com", "b@example.com"])
    drain(config)
    assert outbox(app) == []
    app.close()


def test_ids_are_stable_across_retries_and_a_500_is_retried(make_config, smtp_sink):
    # The first two POSTs fail: the same event comes again with the same id, signed anew.
    with Receiver(lambda n, body: Answer(500, b"database down") if n <= 2 else Answer()) as receiver:
        config = make_config(fast_settings(smtp_sink.port, webhooks=[
            hook(receiver.url, events=["sent"], retry={"schedule": ["100ms"]})]))
        app = Senddock(config)
        make_broadcast(app, ["a@example.com"])
        with running_node(config):
            receiver.wait_for(lambda r: len(r.accepted()) == 1, 30, "the delivery after two failures")
        verified(receiver)
        ids = [r.headers["webhook-id"] for r in receiver.requests]
    assert len(ids) == 3 and len(set(ids)) == 1
    [(kind, status, attempts, last_error)] = outbox(app)
    assert (kind, status, attempts) == ("message.sent", "delivered", 3)
    assert last_error == "HTTP 500 Internal Server Error: database down"
    app.close()
