"""Outgoing webhooks: events written with their facts, delivered signed, at least once."""

from __future__ import annotations

import json
import ssl
import uuid

import pytest
import standardwebhooks
import trustme

from senddock.api import Senddock
from senddock.testing import drain, fast_settings
from senddock.config.webhooks import endpoints
from tests_support import make_broadcast, running_node, wait_for
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
        with running_node(config) as node:
            receiver.wait_for(lambda r: len(r.accepted()) == 1, 30, "the delivery after two failures")
            wait_for(lambda: outbox(app)[0][1] == "delivered", 10, "the delivery recorded")
            [endpoint] = endpoints(config.data)
            counted = {outcome: node.metrics.registry.get_sample_value(
                "senddock_webhook_events_total", {"endpoint": endpoint.id, "outcome": outcome})
                for outcome in ("delivered", "failed")}
        assert counted == {"delivered": 1.0, "failed": 2.0}
        verified(receiver)
        ids = [r.headers["webhook-id"] for r in receiver.requests]
    assert len(ids) == 3 and len(set(ids)) == 1
    [(kind, status, attempts, last_error)] = outbox(app)
    assert (kind, status, attempts) == ("message.sent", "delivered", 3)
    assert last_error == "HTTP 500 Internal Server Error: database down"
    app.close()


def test_a_slow_receiver_times_out_and_does_not_slow_sending(make_config, smtp_sink):
    # The receiver never answers within the timeout: the campaign finishes all the same, while
    # its first POST is still hanging, and each POST ends at its deadline as a failure to retry.
    with Receiver(lambda n, body: Answer(delay=60)) as receiver:
        config = make_config(fast_settings(smtp_sink.port, webhooks=[
            hook(receiver.url, events=["sent"], timeout="500ms", retry={"schedule": ["100ms"]})]))
        app = Senddock(config)
        campaign_id = make_broadcast(app, [f"user{i}@example.com" for i in range(40)])
        with running_node(config):
            wait_for(lambda: app.campaign_status(campaign_id).status == "finished", 60, "the campaign to finish")
            assert "delivered" not in {row[1] for row in outbox(app)}  # finished with no POST answered
            wait_for(lambda: any(row[3] for row in outbox(app)), 30, "a timed-out POST recorded")
    errors = {row[3] for row in outbox(app) if row[3]}
    assert errors == {"timed out after 0.5s"}
    assert {row[1] for row in outbox(app)} == {"pending"}
    app.close()


def _one_event(make_config, receiver_url: str, **options) -> Senddock:
    """A config with one webhook on ``receiver_url`` and one unsubscribed event in its outbox."""
    config = make_config(fast_settings(webhooks=[hook(receiver_url, events=["unsubscribed"], **options)]))
    app = Senddock(config)
    app.create_list("news")
    app.add_subscriber("a@example.com", lists=["news"])
    app.unsubscribe("a@example.com")
    return app


def _deliver_until(app, predicate, what: str) -> None:
    with running_node(app.config):
        wait_for(lambda: predicate(outbox(app)), 30, what)


def test_410_gone_disables_the_endpoint(make_config):
    with Receiver(lambda n, body: Answer(410)) as receiver:
        app = _one_event(make_config, receiver.url)
        _deliver_until(app, lambda rows: rows[0][3] is not None, "the 410 recorded")
        app.unsubscribe("a@example.com")  # already unsubscribed: no second event
        app.add_subscriber("b@example.com", lists=["news"])
        app.unsubscribe("b@example.com")
        from senddock.store import outbox as box
        from senddock.config.webhooks import endpoints

        with app.db.connection() as conn:
            disabled = box.disabled(conn)
            [endpoint] = endpoints(app.config.data)
            assert box.claim(conn, endpoint, uuid.uuid4(), 30) == []  # nothing more is sent to it
    assert list(disabled) == [endpoint.id]
    assert disabled[endpoint.id]["disabled_reason"].startswith("HTTP 410 Gone")
    assert "token=abc" not in disabled[endpoint.id]["url"]  # a query string may carry a secret
    assert len(receiver.requests) == 1
    assert [row[1] for row in outbox(app)] == ["pending", "pending"]
    app.close()


def test_a_redirect_is_not_followed(make_config):
    def answer(n: int, body: bytes) -> Answer:
        return Answer(301, headers={"location": "/elsewhere"}) if n == 1 else Answer()

    with Receiver(answer) as receiver:
        app = _one_event(make_config, receiver.url, retry={"schedule": ["100ms"]})
        _deliver_until(app, lambda rows: rows[0][1] == "delivered", "the delivery after the redirect")
        paths = [r.path for r in receiver.requests]
    assert paths == ["/hooks?token=abc", "/hooks?token=abc"]
    [(_, _, attempts, last_error)] = outbox(app)
    assert attempts == 2
    assert last_error == "HTTP 301 redirect to /elsewhere not followed (point the webhook at the final URL)"
    app.close()


def test_a_tls_failure_is_a_clear_error(make_config):
    ca = trustme.CA()  # a CA the client has never heard of
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server_context)
    with Receiver(tls=server_context) as receiver:
        app = _one_event(make_config, receiver.url)
        _deliver_until(app, lambda rows: rows[0][3] is not None, "the TLS failure recorded")
    [(_, status, _, last_error)] = outbox(app)
    assert status == "pending"
    assert last_error.startswith("TLS failure: certificate verify failed")
    assert receiver.accepted() == []
    app.close()


def test_a_huge_reply_is_not_read(make_config):
    size = 200 * 2**20
    with Receiver(lambda n, body: Answer(500, stream=size) if n == 1 else Answer()) as receiver:
        app = _one_event(make_config, receiver.url, retry={"schedule": ["100ms"]})
        _deliver_until(app, lambda rows: rows[0][1] == "delivered", "the delivery after the huge reply")
    [(_, _, attempts, last_error)] = outbox(app)
    assert attempts == 2
    assert last_error.startswith("HTTP 500 Internal Server Error: xxxx") and len(last_error) < 400
    assert receiver.streamed < size // 4, f"{receiver.streamed} bytes of the reply were taken"
    app.close()


def test_an_event_never_delivered_dies_after_max_age_with_its_last_error(make_config):
    with Receiver(lambda n, body: Answer(503, b"maintenance")) as receiver:
        app = _one_event(make_config, receiver.url, retry={"schedule": ["100ms"], "max_age": "1s"})
        _deliver_until(app, lambda rows: rows[0][1] == "dead", "the event to die")
    [(_, status, attempts, last_error)] = outbox(app)
    assert attempts >= 2 and last_error == "HTTP 503 Service Unavailable: maintenance"
    assert len(receiver.requests) == attempts
    app.close()


def test_delivered_events_are_pruned_after_keep_delivered(make_config):
    from senddock.store import outbox as box
    from senddock.config.webhooks import endpoints

    with Receiver() as receiver:
        app = _one_event(make_config, receiver.url, keep_delivered="1h", keep_dead="2h")
        _deliver_until(app, lambda rows: rows[0][1] == "delivered", "the delivery")
    [endpoint] = endpoints(app.config.data)
    with app.db.connection() as conn:
        assert box.prune(conn, endpoint) == (0, 0)  # delivered less than 1h ago: kept
        conn.execute("UPDATE webhook_outbox SET done_at = now() - interval '61 minutes'")
        assert box.prune(conn, endpoint) == (1, 0)
        assert outbox(app) == []
        # Dead events are kept keep_dead (2h); an endpoint's receiver turned off: its pending
        # events die once past retry.max_age (3d), and are then kept as dead ones are.
        for status, age in (("dead", "3 hours"), ("dead", "1 hour"), ("pending", "4 days")):
            conn.execute("INSERT INTO webhook_outbox (endpoint, type, payload, status, created_at, done_at) "
                         "VALUES (%s, 'subscriber.unsubscribed', '{}', %s, now() - %s::interval, "
                         "CASE WHEN %s = 'dead' THEN now() - %s::interval END)",
                         (endpoint.id, status, age, status, age))
        assert box.prune(conn, endpoint) == (1, 0)  # the pending one waits: its endpoint is not disabled
        box.disable(conn, endpoint, "HTTP 410 Gone")
        assert box.prune(conn, endpoint) == (0, 1)
    assert [(row[1], row[3]) for row in outbox(app)] == [("dead", None), ("dead", "endpoint disabled: HTTP 410 Gone")]
    app.close()


def test_batches_are_json_arrays_each_event_with_its_id(make_config, smtp_sink):
    with Receiver() as receiver:
        config = make_config(fast_settings(smtp_sink.port, webhooks=[hook(receiver.url, events=["sent"], batch=10)]))
        app = Senddock(config)
        emails = [f"user{i}@example.com" for i in range(25)]
        make_broadcast(app, emails)
        with running_node(config):
            receiver.wait_for(lambda r: len(r.events()) == 25, 30, "25 events")
        events = verified(receiver)
        bodies = [r.body for r in receiver.accepted()]
        headers = [r.headers["webhook-id"] for r in receiver.accepted()]
    assert all(body.startswith(b"[") for body in bodies)
    assert all(len(json.loads(body)) <= 10 for body in bodies)
    assert len(bodies) < 25  # batched, at least some of them
    assert all(h.startswith("batch_") for h in headers)
    assert sorted(e["data"]["email"] for e in events) == sorted(emails)
    assert len({e["id"] for e in events}) == 25
    app.close()


def test_the_outbox_is_written_with_the_fact_and_never_without_it(make_config):
    from senddock.domain.events import UnknownMessage
    from senddock.outcome import ProviderEvent

    with Receiver() as receiver:
        config = make_config(fast_settings(webhooks=[hook(receiver.url)]))
    app = Senddock(config)
    campaign_id = make_broadcast(app, ["a@example.com"])
    with app.db.connection() as conn:
        job_id = conn.execute("SELECT id FROM broadcast_jobs").fetchone()[0]
        conn.execute("UPDATE broadcast_jobs SET status = 'sent', provider_message_id = 'm-1'")
    bounce = ProviderEvent(kind="bounce", email="a@example.com", provider_message_id="m-1", event_key="k1",
                           suppresses=True, bounce_type="Permanent", sub_type="General", diagnostic="550 5.1.1 gone")
    unknown = ProviderEvent(kind="complaint", email="x@example.com", provider_message_id="nobody", event_key="k2",
                            suppresses=True)
    with pytest.raises(UnknownMessage):  # one notification: recorded whole or not at all
        _apply(app, [bounce, unknown])
    assert outbox(app) == []
    _apply(app, [bounce])
    _apply(app, [bounce])  # the same notification again: no second event
    complaint = ProviderEvent(kind="complaint", email="a@example.com", provider_message_id="m-1", event_key="k3",
                              suppresses=True, sub_type="abuse")
    _apply(app, [complaint])
    app.pause_campaign(campaign_id)
    with app.db.connection() as conn:
        payloads = [row[0] for row in conn.execute("SELECT payload FROM webhook_outbox ORDER BY id")]
    types = [p["type"] for p in payloads]
    assert types == ["message.bounced", "message.complained", "campaign.paused"]
    assert payloads[0]["data"] == {"campaign_id": campaign_id, "broadcast_id": payloads[0]["data"]["broadcast_id"],
                                   "job_id": job_id, "email": "a@example.com", "source": "notification",
                                   "bounce_type": "hard", "code": None, "enhanced_code": "General",
                                   "diagnostic": "550 5.1.1 gone"}
    assert payloads[2]["data"] == {"campaign_id": campaign_id, "reason": "paused by the operator", "auto_resume": False}
    app.close()


def _apply(app, events):
    from senddock.domain.events import apply_events

    return apply_events(app.db, app.config.plugin_manager, app.config, app.suppressions, events)


def payloads(app) -> list[dict]:
    with app.db.connection() as conn:
        return [row[0] for row in conn.execute("SELECT payload FROM webhook_outbox ORDER BY id")]


def test_bounces_at_the_send_and_the_bounce_rate_pause_are_events(make_config, smtp_sink):
    from senddock.sink import FailRule

    smtp_sink.handler.rules = [FailRule.parse("dead*@*=550 5.1.1 no such user")]
    with Receiver() as receiver:
        config = make_config(fast_settings(smtp_sink.port, concurrency=1, webhooks=[
            hook(receiver.url, events=["bounced", "campaign_paused", "campaign_finished"])]))
    app = Senddock(config)
    emails = [f"dead{i}@example.com" for i in range(8)] + [f"user{i}@example.com" for i in range(30)]
    campaign_id = make_broadcast(app, emails)
    drain(config)  # the receiver is gone: the events wait in the outbox
    found = payloads(app)
    bounced = [p["data"] for p in found if p["type"] == "message.bounced"]
    assert bounced and {b["email"] for b in bounced} <= {f"dead{i}@example.com" for i in range(8)}
    assert all((b["source"], b["bounce_type"], b["code"], b["enhanced_code"]) == ("send", "hard", 550, "5.1.1")
               for b in bounced)
    paused = [p["data"] for p in found if p["type"] == "campaign.paused"]
    assert paused == [{"campaign_id": campaign_id, "reason": "bounce_rate", "auto_resume": False}]
    assert not [p for p in found if p["type"] == "campaign.finished"]
    assert not [p for p in found if p["type"] == "message.sent"]  # not subscribed: not written
    app.close()


def test_an_unsubscribe_link_is_announced_once(make_config):
    from senddock.domain import subscribers
    from senddock.config.webhooks import subscriptions

    with Receiver() as receiver:
        config = make_config(fast_settings(webhooks=[hook(receiver.url, events=["unsubscribed"])]))
    app = Senddock(config)
    campaign_id = make_broadcast(app, ["a@example.com"], send=False)
    subscriber_id = app.subscriber("a@example.com")["id"]
    with app.db.connection() as conn:
        for _ in range(2):  # mail providers repeat one-click posts
            assert subscribers.unsubscribe(conn, subscriber_id, campaign_id,
                                           webhooks=subscriptions(config.data)) == "a@example.com"
    assert [p["data"] for p in payloads(app)] == [
        {"email": "a@example.com", "subscriber_id": subscriber_id, "campaign_id": campaign_id, "source": "link"}]
    app.close()


def test_a_url_with_credentials_sends_basic_auth_and_never_shows_the_password(make_config):
    import base64

    from senddock.config.webhooks import endpoints

    with Receiver() as receiver:
        url = receiver.url.replace("http://", "http://hooks:pa%40ss@")
        app = _one_event(make_config, url)
        _deliver_until(app, lambda rows: rows[0][1] == "delivered", "the delivery")
        [request] = receiver.requests
    assert request.headers["authorization"] == "Basic " + base64.b64encode(b"hooks:pa@ss").decode()
    [endpoint] = endpoints(app.config.data)
    assert endpoint.shown_url.startswith("http://hooks:***@127.0.0.1:") and "pa%40ss" not in repr(endpoint)
    app.close()


def test_retry_after_is_honoured_when_longer_than_the_schedule(make_config):
    with Receiver(lambda n, body: Answer(429, b"slow down", headers={"retry-after": "3600"})) as receiver:
        app = _one_event(make_config, receiver.url, retry={"schedule": ["1s"]})
        _deliver_until(app, lambda rows: rows[0][3] is not None, "the 429 recorded")
    with app.db.connection() as conn:
        wait = conn.execute("SELECT extract(epoch FROM next_attempt_at - now()) FROM webhook_outbox").fetchone()[0]
    assert 3000 < wait <= 3600  # the receiver's hour, not the schedule's second
    assert outbox(app)[0][3] == "HTTP 429 Too Many Requests: slow down"
    app.close()
