"""One relay's fault must never damage a list: refusals that suppress nobody, the bounce-rate
breaker, throttling that uses up no retries, and a relay-trouble pause that resumes by itself."""

from __future__ import annotations

import threading
import time

import psycopg

from senddock.api import Senddock
from senddock.core.epoch import ensure_epoch
from senddock.store.node_identity import NodeIdentity
from senddock.store.jobs import JobResult, JobQueue
from senddock.sink import FailRule, Sink
from senddock.testing import drain, fast_settings
from tests_support import jobs_by_email, make_broadcast, running_node, suppressed, wait_for


def _campaign(app, campaign_id: int) -> tuple:
    with app.db.connection() as conn:
        return conn.execute("SELECT status, paused_reason, auto_resume, paused_at IS NOT NULL FROM campaigns "
                            "WHERE id = %s", (campaign_id,)).fetchone()


def _delivered(sink) -> dict[str, int]:
    counts: dict[str, int] = {}
    for message in sink.received:
        counts[message.recipients[0]] = counts.get(message.recipients[0], 0) + 1
    return counts


def test_a_relay_refusing_everyone_with_the_generic_550_suppresses_nobody(make_config, smtp_sink):
    # RFC 5321's default 550 text, no enhanced code: what a relay says for "relaying denied" too.
    smtp_sink.handler.rules = [FailRule.parse("*=550 Requested action not taken: mailbox unavailable (relaying denied)")]
    app = Senddock(make_config(fast_settings(smtp_sink.port, transport={"name": "smtp", "max_consecutive_failures": 5},
                                             concurrency=1)))
    emails = [f"user{i}@example.com" for i in range(40)]
    campaign_id = make_broadcast(app, emails)
    drain(app.config)
    assert suppressed(app) == {}
    assert _campaign(app, campaign_id)[:3] == ("paused", "5 consecutive failures: rejected", False)
    status = app.campaign_status(campaign_id)
    assert status.failed_by_reason == {"rejected": 5} and status.pending == 35
    # The operator fixes the relay, puts the five back and resumes: everyone gets it exactly once.
    smtp_sink.handler.rules = []
    app.requeue_campaign(campaign_id, "rejected")
    app.resume_campaign(campaign_id)
    drain(app.config)
    assert app.campaign_status(campaign_id).status == "finished"
    assert _delivered(smtp_sink) == {email: 1 for email in emails}
    assert suppressed(app) == {}
    app.close()


def test_a_breaker_trips_before_the_senders_next_jobs_of_its_campaign_begin(make_config, smtp_sink):
    """Four senders, each with its next job marked begun already (the runway): once a failure that
    is not the recipient's comes back, no job of its campaign begins until its commit (and the
    breaker) has acted, so the relay sees the breaker's 5 failures plus at most the sends already
    in flight then, one per sender."""
    smtp_sink.handler.rules = [FailRule.parse("*=550 Requested action not taken: mailbox unavailable (relaying denied)")]
    smtp_sink.handler.delay = 0.02
    app = Senddock(make_config(fast_settings(smtp_sink.port, transport={"name": "smtp", "max_consecutive_failures": 5},
                                             concurrency=4)))
    campaign_id = make_broadcast(app, [f"user{i}@example.com" for i in range(200)])
    drain(app.config)
    status = app.campaign_status(campaign_id)
    assert status.status == "paused"
    assert 5 <= status.failed_by_reason["rejected"] <= 5 + 4, status.failed_by_reason
    assert suppressed(app) == {}
    app.close()


def _through_a_lying_relay(make_config, sink, recipients: int, concurrency: int) -> tuple[Senddock, int, list[str]]:
    """A broadcast drained through a misconfigured relay that says "user unknown" for everyone."""
    sink.handler.rules = [FailRule.parse("*=550 5.1.1 <x>: Recipient address rejected: User unknown")]
    app = Senddock(make_config(fast_settings(sink.port, concurrency=concurrency)))
    emails = [f"user{i}@example.com" for i in range(recipients)]
    campaign_id = make_broadcast(app, emails)
    drain(app.config)
    return app, campaign_id, emails


def test_the_bounce_rate_breaker_pauses_and_unsuppress_undoes_its_window(make_config, smtp_sink):
    app, campaign_id, emails = _through_a_lying_relay(make_config, smtp_sink, 200, concurrency=2)
    # More than 5 of the first 10 results bounced: paused before the list was damaged.
    assert _campaign(app, campaign_id)[:2] == ("paused", "bounce_rate")
    bounced = {e for e, (status, reason, _) in jobs_by_email(app, campaign_id).items() if reason == "bounced"}
    # The window, plus per worker one bounce recorded as it tripped and one send already begun.
    assert 6 <= len(bounced) <= 6 + 2 * 2
    # The bounce that tripped it, and those after, are held (not suppressed) until a person decides.
    was_suppressed = suppressed(app)
    with app.db.connection() as conn:
        held = conn.execute("SELECT count(*) FROM pending_bounces WHERE node_id IS NULL").fetchone()[0]
    assert set(was_suppressed) <= bounced and held >= 1
    assert len(was_suppressed) + held == len(bounced)

    done = app.unsuppress_campaign(campaign_id, since_pause=True)
    assert (done.unsuppressed, done.requeued) == (len(was_suppressed), len(bounced))
    assert suppressed(app) == {}
    smtp_sink.handler.rules = []  # the relay is fixed
    app.resume_campaign(campaign_id)
    drain(app.config)
    assert app.campaign_status(campaign_id).status == "finished"
    assert _delivered(smtp_sink) == {email: 1 for email in emails}
    assert suppressed(app) == {}
    app.close()


def test_after_a_bounce_rate_pause_resuming_says_the_bounces_were_real(make_config, smtp_sink):
    smtp_sink.handler.rules = [FailRule.parse("dead*@*=550 5.1.1 no such user")]
    app = Senddock(make_config(fast_settings(smtp_sink.port, concurrency=1)))
    emails = [f"dead{i}@example.com" for i in range(8)] + [f"user{i}@example.com" for i in range(30)]
    campaign_id = make_broadcast(app, emails)
    drain(app.config)
    assert _campaign(app, campaign_id)[:2] == ("paused", "bounce_rate")
    app.resume_campaign(campaign_id)  # a person looked: those addresses really are dead
    drain(app.config)
    assert app.campaign_status(campaign_id).status == "finished"
    # Every bounce suppressed, the held ones included; the breaker counted afresh after the resume.
    assert suppressed(app) == {f"dead{i}@example.com": "bounced" for i in range(8)}
    with app.db.connection() as conn:
        assert conn.execute("SELECT count(*) FROM pending_bounces").fetchone() == (0,)
    assert _delivered(smtp_sink) == {f"user{i}@example.com": 1 for i in range(30)}
    app.close()


def test_bounces_neither_add_to_nor_end_a_run_of_relay_failures(make_config, smtp_sink):
    smtp_sink.handler.rules = [FailRule.parse("dead*@*=550 5.1.1 no such user"),
                               FailRule.parse("user*@*=451 temporary failure")]
    settings = fast_settings(smtp_sink.port, concurrency=1, transport={"name": "smtp", "max_consecutive_failures": 5},
                             breaker={"bounce_rate": 1.0, "early_bounces": 9, "early_window": 10})
    app = Senddock(make_config(settings))
    # Interleaved (in id order): a relay failure, a bounce, a relay failure...
    emails = [e for i in range(10) for e in (f"user{i}@example.com", f"dead{i}@example.com")]
    campaign_id = make_broadcast(app, emails)
    drain(app.config)
    # Five relay failures in a row, bounces between them: paused (a bounce used to end the run).
    assert _campaign(app, campaign_id)[:2] == ("paused", "5 consecutive failures: deferred_rcpt")
    app.close()


def test_throttling_uses_up_no_retries_and_never_pauses(make_config, smtp_sink):
    smtp_sink.handler.rules = [FailRule.parse("slow*@*=421 4.7.0 Try again later, closing connection"),
                               FailRule.parse("busy*@*=451 4.7.1 rate limited, slow down")]
    settings = fast_settings(smtp_sink.port, concurrency=1, transport={"name": "smtp", "max_consecutive_failures": 2},
                             retry={"schedule": ["300ms"], "max_retries": 1, "jitter": 0, "max_age": "3s"})
    app = Senddock(make_config(settings))
    emails = [f"slow{i}@example.com" for i in range(3)] + [f"busy{i}@example.com" for i in range(3)] + ["ok@example.com"]
    campaign_id = make_broadcast(app, emails)
    drain(app.config)
    status, _, _, ever_paused = _campaign(app, campaign_id)
    assert (status, ever_paused) == ("finished", False)
    with app.db.connection() as conn:
        jobs = conn.execute("SELECT email, status, failure_reason, attempts, deferrals FROM broadcast_jobs").fetchall()
    for email, state, reason, attempts, deferrals in jobs:
        if email == "ok@example.com":
            assert (state, attempts) == ("sent", 1)
        else:
            # Deferred far more often than max_retries allows, failed only once retry.max_age passed.
            assert (state, reason, attempts) == ("failed", "expired", 1) and deferrals > 2, (email, deferrals)
    assert suppressed(app) == {}
    app.close()


def test_relay_trouble_at_rcpt_pauses_for_the_relay_not_the_recipients(make_config, smtp_sink):
    smtp_sink.handler.rules = [FailRule.parse("*=452 4.3.1 Insufficient system storage")]
    settings = fast_settings(smtp_sink.port, concurrency=1, transport={"name": "smtp", "max_consecutive_failures": 4},
                             retry={"schedule": ["1h"], "max_retries": 0, "jitter": 0},
                             breaker={"probe_interval": "1h", "probe_max_interval": "1h"})
    app = Senddock(make_config(settings))
    campaign_id = make_broadcast(app, [f"user{i}@example.com" for i in range(10)])
    drain(app.config)
    status, reason, auto_resume, _ = _campaign(app, campaign_id)
    assert (status, auto_resume) == ("paused", True)
    assert reason == "relay_unavailable: 4 consecutive failures: relay_error"
    # Not the recipients' fault: no retry of theirs was used up (max_retries 0 would have failed them).
    assert {v[:2] for v in jobs_by_email(app, campaign_id).values()} == {("retry", None), ("pending", None)}
    assert suppressed(app) == {}
    app.close()


def test_a_relay_outage_pauses_the_campaign_and_it_resumes_by_itself(make_config):
    smtp_sink = Sink("127.0.0.1", 0).start()
    port = smtp_sink.port
    settings = fast_settings(port, concurrency=2, transport={"name": "smtp", "max_consecutive_failures": 5},
                             retry={"schedule": ["500ms"], "max_retries": 1, "jitter": 0},
                             breaker={"probe_interval": "300ms", "probe_max_interval": "1s"})
    settings["smtp"]["timeout"] = "2s"
    app = Senddock(make_config(settings))
    emails = [f"user{i}@example.com" for i in range(300)]
    campaign_id = make_broadcast(app, emails)
    relay = smtp_sink
    with running_node(app.config):
        wait_for(lambda: len(relay.received) > 30, 60, "sending to start")
        relay.stop()  # the relay goes away: connections are refused
        wait_for(lambda: _campaign(app, campaign_id)[0] == "paused", 60, "the pause for relay trouble")
        reason = _campaign(app, campaign_id)[1]
        assert reason.startswith("relay_unavailable: 5 consecutive failures: connection_error")
        wait_for(lambda: app.campaign_status(campaign_id).probes_failed >= 2, 30, "failed probes")
        status = app.campaign_status(campaign_id)
        assert status.auto_resume and status.next_probe_at is not None and "Connection refused" in status.last_probe
        relay = Sink("127.0.0.1", port).start()  # back on the same port
        wait_for(lambda: app.campaign_status(campaign_id).status == "finished", 90, "the campaign to resume and finish")
    relay.stop()
    delivered = _delivered(smtp_sink)
    for email, n in _delivered(relay).items():
        delivered[email] = delivered.get(email, 0) + n
    assert set(delivered) == set(emails)
    with app.db.connection() as conn:
        in_doubt = {r[0] for r in conn.execute(
            "SELECT j.email FROM delivery_attempts a JOIN broadcast_jobs j ON j.id = a.job_id WHERE a.in_doubt")}
        resumed_by_probe = conn.execute("SELECT probe_result FROM campaigns WHERE id = %s", (campaign_id,)).fetchone()[0]
    assert {e for e, n in delivered.items() if n > 1} <= in_doubt
    assert resumed_by_probe.startswith("250")  # the probe's NOOP answer
    # No recipient's retries were used up by the outage: nobody failed.
    assert app.campaign_status(campaign_id).failed == 0
    app.close()


def test_a_pause_a_person_must_judge_stays_paused(make_config):
    with Sink("127.0.0.1", 0, credentials=("mailer", "right")) as sink:
        settings = fast_settings(sink.port, breaker={"probe_interval": "100ms", "probe_max_interval": "100ms"})
        settings["smtp"].update(username="mailer", password="${SMTP_TEST_PASSWORD}")
        import os

        os.environ["SMTP_TEST_PASSWORD"] = "wrong"
        try:
            app = Senddock(make_config(settings))
            campaign_id = make_broadcast(app, ["a@example.com", "b@example.com"])
            drain(app.config)
            time.sleep(0.5)  # several probe intervals: nothing probes a pause for bad credentials
            drain(app.config)
            assert _campaign(app, campaign_id)[:3] == ("paused", "auth_failed", False)
            assert sink.received == []
        finally:
            del os.environ["SMTP_TEST_PASSWORD"]
    app.close()


def test_a_bounce_seen_under_a_lost_claim_still_suppresses(senddock_app, database_dsn):
    make_broadcast(senddock_app, ["dead@example.com"])
    with psycopg.connect(database_dsn, autocommit=True) as conn:
        ensure_epoch(conn)
        slow = NodeIdentity(__import__("uuid").uuid4(), "slow", "h", 1)
        queue = JobQueue(conn, slow)
        [job] = queue.claim(1)
        # Meanwhile the job was taken over (its node looked dead): this claim is lost.
        conn.execute("UPDATE broadcast_jobs SET claim_token = gen_random_uuid()")
        bounce = JobResult(status="failed", outcome="bounce", counts=True, failure_reason="bounced", bounce=True,
                           code=550, enhanced_code="5.1.1", last_result="550 5.1.1 no such user")
        assert not queue.record(job, 1, None, bounce).recorded
        assert conn.execute("SELECT email FROM pending_bounces").fetchall() == [("dead@example.com",)]
        # The job's new owner finishes it (its node is not this test's concern).
        conn.execute("UPDATE broadcast_jobs SET status = 'failed', failure_reason = 'bounced', claimed_by = NULL, "
                     "claim_token = NULL")
    drain(senddock_app.config)  # a node's chores run the hooks of a bounce whose node is gone
    assert suppressed(senddock_app) == {"dead@example.com": "bounced"}


def test_pending_bounces_are_handled_by_one_node_each(senddock_app, database_dsn):
    make_broadcast(senddock_app, [f"dead{i}@example.com" for i in range(40)])
    with psycopg.connect(database_dsn, autocommit=True) as conn:
        ensure_epoch(conn)
        conn.execute("INSERT INTO pending_bounces (job_id, broadcast_id, campaign_id, email, node_id) "
                     "SELECT id, broadcast_id, 1, email, gen_random_uuid() FROM broadcast_jobs")
        nodes = []
        for name in ("one", "two"):
            node = NodeIdentity(__import__("uuid").uuid4(), name, "h", 1)
            conn.execute("INSERT INTO nodes (id, name, host, pid) VALUES (%s, %s, 'h', 1)", (node.id, name))
            nodes.append(node)
    barrier = threading.Barrier(2)
    taken: dict[str, list[int]] = {}

    def take(node: NodeIdentity) -> None:
        with psycopg.connect(database_dsn, autocommit=True) as conn:
            barrier.wait()
            taken[node.name] = [row["job_id"] for row in JobQueue(conn, node).pending_bounces(lease=30)]

    threads = [threading.Thread(target=take, args=(n,)) for n in nodes]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(taken["one"] + taken["two"]) == sorted(set(taken["one"] + taken["two"]))  # nobody twice
    assert len(taken["one"]) + len(taken["two"]) == 40
    # Taken over by a live node, they are not handed to the other one afterwards either.
    with psycopg.connect(database_dsn, autocommit=True) as conn:
        assert JobQueue(conn, nodes[1]).pending_bounces(lease=30) == []


def test_an_empty_claim_finishes_the_campaign_at_once(make_config, smtp_sink):
    # A long poll interval: only the worker's own finish after its empty claim can finish it soon.
    app = Senddock(make_config(fast_settings(smtp_sink.port, concurrency=1, claim_batch=5, poll_interval="60s")))
    campaign_id = make_broadcast(app, [f"user{i}@example.com" for i in range(5)])
    with running_node(app.config):
        wait_for(lambda: app.campaign_status(campaign_id).status == "finished", 15, "the campaign to finish")
    app.close()


def test_probes_go_on_however_long_the_relay_stays_away(senddock_app, database_dsn):
    """2^1024 overflows float8: after ~1000 probes the backoff must stay capped, not fail every probe."""
    campaign_id = make_broadcast(senddock_app, ["a@example.com"])
    with psycopg.connect(database_dsn, autocommit=True) as conn:
        conn.execute("UPDATE campaigns SET status = 'paused', paused_reason = 'relay_unavailable: test', "
                     "auto_resume = true, probe_at = now(), probes = 1100")
        due = JobQueue(conn, NodeIdentity(__import__("uuid").uuid4(), "n", "h", 1)).probe_due(5.0, 300.0)
        wait = conn.execute("SELECT extract(epoch FROM probe_at - now()) FROM campaigns").fetchone()[0]
    assert due is not None and due[0] == campaign_id
    assert 290 < wait <= 300


def test_an_operator_can_take_over_a_pause_that_would_resume_by_itself(senddock_app, database_dsn):
    campaign_id = make_broadcast(senddock_app, ["a@example.com"])
    with psycopg.connect(database_dsn, autocommit=True) as conn:
        conn.execute("UPDATE campaigns SET status = 'paused', paused_reason = 'relay_unavailable: test', "
                     "auto_resume = true, probe_at = now()")
    senddock_app.pause_campaign(campaign_id)
    assert _campaign(senddock_app, campaign_id)[:3] == ("paused", "paused by the operator", False)


def test_unsuppress_never_reaches_an_address_that_unsubscribed_or_complained_since(make_config, smtp_sink):
    app, campaign_id, _ = _through_a_lying_relay(make_config, smtp_sink, 40, concurrency=1)
    assert _campaign(app, campaign_id)[:2] == ("paused", "bounce_rate")
    # Two of the wrongly bounced addresses then unsubscribe, a third complains.
    from senddock.store.suppressions import Suppressions

    app.unsubscribe("user0@example.com")
    Suppressions(app.db).add("user1@example.com", reason="complained")
    app.blocklist("user2@example.com")
    done = app.unsuppress_campaign(campaign_id, since_pause=True)
    smtp_sink.handler.rules = []
    app.resume_campaign(campaign_id)
    drain(app.config)
    delivered = _delivered(smtp_sink)
    assert not {"user0@example.com", "user1@example.com", "user2@example.com"} & set(delivered)
    # Their suppressions took the stronger reason, which unsuppress never undoes.
    left = suppressed(app)
    assert set(left) == {"user0@example.com", "user1@example.com", "user2@example.com"}
    assert (left["user0@example.com"], left["user1@example.com"]) == ("unsubscribed", "complained")
    assert left["user2@example.com"] != "bounced"
    assert done.requeued >= 3  # the others that bounced in the window are back in line
    app.close()
