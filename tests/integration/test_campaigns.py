from __future__ import annotations

import threading

import psycopg
import pytest

from senddock.errors import InvalidInput, InvalidState, NotFound


def campaign(app, lists=("news",), **overrides) -> int:
    fields = {"name": "Launch", "lists": list(lists), "subject": "Hello", "from_addr": "News <news@example.com>",
              "text_body": "Hi!"}
    return app.create_campaign(**{**fields, **overrides})


@pytest.fixture
def audience(senddock_app):
    senddock_app.create_list("news")
    senddock_app.create_list("vip")
    for i in range(10):
        senddock_app.add_subscriber(f"user{i}@example.com", lists=["news"])
    senddock_app.add_subscriber("user0@example.com", lists=["vip"])  # on both lists: one job
    senddock_app.add_subscriber("vip@example.com", lists=["vip"])
    senddock_app.suppress("user1@example.com")
    senddock_app.suppress("USER2@example.com")  # case-insensitive
    with senddock_app.db.connection() as conn:
        conn.execute("UPDATE subscribers SET status = 'unsubscribed' WHERE email = 'user3@example.com'")
        conn.execute("UPDATE subscribers SET status = 'blocklisted' WHERE email = 'user4@example.com'")
    return senddock_app


def test_send_enqueues_active_unsuppressed_members_once(audience):
    cid = campaign(audience, lists=("news", "vip"))
    result = audience.send_campaign(cid)
    assert (result.enqueued, result.skipped, result.skipped_suppressed, result.skipped_unsubscribed) == (7, 4, 2, 2)
    status = audience.campaign_status(cid)
    assert status.status == "sending"
    assert status.broadcast_id == result.broadcast_id
    assert (status.total, status.pending, status.sent, status.failed, status.skipped) == (7, 7, 0, 0, 4)
    with audience.db.connection() as conn:
        jobs = conn.execute(
            "SELECT email, domain, status, attempts FROM broadcast_jobs WHERE broadcast_id = %s ORDER BY email",
            (result.broadcast_id,),
        ).fetchall()
    assert [j[0] for j in jobs] == ["user0@example.com"] + [f"user{i}@example.com" for i in range(5, 10)] + ["vip@example.com"]
    assert {j[1:] for j in jobs} == {("example.com", "pending", 0)}


def test_an_unsubscribed_reader_counts_as_unsubscribed_not_suppressed(audience):
    # Unsubscribing also suppresses the address: the skip is still told by its cause.
    audience.unsubscribe("user5@example.com")
    result = audience.send_campaign(campaign(audience))
    assert (result.enqueued, result.skipped_suppressed, result.skipped_unsubscribed) == (5, 2, 3)


def test_a_campaign_is_sent_once(audience):
    cid = campaign(audience)
    audience.send_campaign(cid)
    with pytest.raises(InvalidState, match="already sent"):
        audience.send_campaign(cid)


def test_a_sent_campaign_is_refused_as_sent_before_its_recipients_are_checked(audience):
    # Someone without the attribute joined after the send: the answer is still "sent once", not them.
    cid = campaign(audience, text_body="Hi {{ subscriber.attributes.city }}")
    with audience.db.connection() as conn:
        conn.execute("""UPDATE subscribers SET attributes = '{"city": "Paris"}'""")
    audience.send_campaign(cid)
    audience.add_subscriber("late@example.com", lists=["news"])
    with pytest.raises(InvalidState, match=rf"already sent .*`senddock campaign clone {cid}`"):
        audience.send_campaign(cid)


def test_two_concurrent_sends_of_one_campaign_enqueue_once(audience):
    cid = campaign(audience)
    outcomes = []

    def send():
        try:
            outcomes.append(audience.send_campaign(cid).enqueued)
        except InvalidState:
            outcomes.append("refused")

    threads = [threading.Thread(target=send) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes, key=str) == [6, "refused"]
    with audience.db.connection() as conn:
        assert conn.execute("SELECT count(*) FROM broadcast_jobs").fetchone() == (6,)


def test_a_campaign_with_nobody_to_send_to_is_refused_and_stays_a_draft(senddock_app):
    senddock_app.create_list("empty")
    cid = campaign(senddock_app, lists=("empty",))
    with pytest.raises(InvalidState, match="nobody to send to, its list empty has no subscribers; it is still a draft"):
        senddock_app.send_campaign(cid)
    assert senddock_app.campaign_status(cid).status == "draft"
    with senddock_app.db.connection() as conn:
        assert conn.execute("SELECT count(*) FROM broadcasts").fetchone() == (0,)


def test_send_notifies_listening_workers_on_commit(audience, database_dsn):
    cid = campaign(audience)
    with psycopg.connect(database_dsn, autocommit=True) as listener:
        listener.execute("LISTEN senddock_jobs")
        result = audience.send_campaign(cid)
        notifications = list(listener.notifies(timeout=5, stop_after=1))
    assert [n.payload for n in notifications] == [str(result.broadcast_id)]


def test_status_counts_come_from_the_jobs(audience):
    cid = campaign(audience)
    broadcast = audience.send_campaign(cid).broadcast_id
    with audience.db.connection() as conn:
        ids = [r[0] for r in conn.execute("SELECT id FROM broadcast_jobs WHERE broadcast_id = %s ORDER BY id", (broadcast,))]
        conn.execute("UPDATE broadcast_jobs SET status = 'sent' WHERE id = %s", (ids[0],))
        conn.execute("UPDATE broadcast_jobs SET status = 'failed', failure_reason = 'bounced' WHERE id = %s", (ids[1],))
        conn.execute("UPDATE broadcast_jobs SET status = 'failed', failure_reason = 'rejected' WHERE id = %s", (ids[2],))
        conn.execute("UPDATE broadcast_jobs SET status = 'retry' WHERE id = %s", (ids[3],))
    status = audience.campaign_status(cid)
    assert (status.total, status.pending, status.retry, status.sent, status.failed, status.bounced) == (6, 2, 1, 1, 2, 1)
    assert status.failed_by_reason == {"bounced": 1, "rejected": 1}


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"from_addr": "not an address"}, "^from_addr "),
        ({"reply_to": "x@"}, "^reply_to "),
        ({"text_body": None}, "needs a body"),
        ({"subject": "  "}, "needs a subject"),
        ({"lists": []}, "at least one list"),
    ],
)
def test_create_refuses_bad_input(audience, overrides, message):
    with pytest.raises(InvalidInput, match=message):
        campaign(audience, **overrides)


def test_unknown_list_and_campaign(audience):
    with pytest.raises(NotFound, match="no list named 'nope'"):
        campaign(audience, lists=("nope",))
    with pytest.raises(NotFound, match="no campaign with id 999"):
        audience.send_campaign(999)
    with pytest.raises(NotFound):
        audience.campaign_status(999)
