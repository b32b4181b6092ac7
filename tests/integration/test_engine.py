"""The engine end to end, in-process, through a real SMTP server (aiosmtpd) on 127.0.0.1."""

from __future__ import annotations

import time
from collections import Counter

import pytest

from senddock.api import Senddock
from senddock.core.runner import Runner
from senddock.sink import FailRule
from senddock.testing import drain, fast_settings
from tests_support import jobs_by_email, make_broadcast, suppressed


@pytest.fixture
def app_for(make_config):
    opened = []

    def make(settings):
        app = Senddock(make_config(settings))
        opened.append(app)
        return app

    yield make
    for app in opened:
        app.close()


def run_until_idle(config, failure: str) -> None:
    """A node told to exit when idle, in a thread; the test fails with ``failure`` if it never does."""
    import threading

    runner = Runner(config, exit_when_idle=True)
    thread = threading.Thread(target=runner.run)
    thread.start()
    thread.join(30)
    if thread.is_alive():
        runner.request_stop()
        thread.join(30)
        pytest.fail(failure)


def losing_the_connection_once(original, calls: list):
    """``original`` (a JobQueue method) as if the connection were lost in its first call; calls noted."""
    import psycopg

    def call(self, *args, **kwargs):
        calls.append(args)
        if len(calls) == 1:
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        return original(self, *args, **kwargs)

    return call


def assert_sent_but_one_bounce(app, campaign_id: int, emails: list[str]) -> None:
    """Every ok* address sent, bounce1 failed as bounced, suppressed, its hooks run."""
    jobs = jobs_by_email(app, campaign_id)
    assert jobs["bounce1@example.com"] == ("failed", "bounced", 1)
    assert all(jobs[email][0] == "sent" for email in emails if email.startswith("ok"))
    assert app.campaign_status(campaign_id).status == "finished"
    assert suppressed(app) == {"bounce1@example.com": "bounced"}
    with app.db.connection() as conn:
        assert conn.execute("SELECT count(*) FROM pending_bounces").fetchone() == (0,)  # its hooks ran


def test_every_subscriber_receives_the_message_once(app_for, smtp_sink):
    app = app_for(fast_settings(smtp_sink.port))
    emails = [f"user{i}@example.com" for i in range(60)]
    campaign_id = make_broadcast(app, emails)
    stats = drain(app.config)
    received = smtp_sink.received
    assert Counter(r.recipients[0] for r in received) == Counter(emails)
    assert len({r.message_id for r in received}) == 60
    status = app.campaign_status(campaign_id)
    assert (status.status, status.sent, status.failed) == ("finished", 60, 0)
    assert stats["sent"] == 60
    with app.db.connection() as conn:
        attempts = conn.execute("SELECT outcome, count(*) FROM delivery_attempts GROUP BY 1").fetchall()
        message_ids = {r[0] for r in conn.execute("SELECT DISTINCT node_id FROM delivery_attempts")}
    assert attempts == [("sent", 60)]
    assert len(message_ids) == 1


def test_bounces_retries_and_sender_problems(app_for, smtp_sink):
    smtp_sink.handler.rules = [
        FailRule.parse("bounce*@*=550 5.1.1 no such user"),
        FailRule.parse("gone*@*=550 mailbox does not exist"),
        FailRule.parse("later*@*=450 4.2.0 mailbox busy, try again"),
        FailRule.parse("*@badsender.example=553 5.1.8 Sender address rejected: domain not found"),
    ]
    app = app_for(fast_settings(smtp_sink.port))
    emails = ["ok1@example.com", "ok2@example.com", "bounce1@example.com", "gone1@example.com",
              "later1@example.com", "x@badsender.example"]
    campaign_id = make_broadcast(app, emails)
    drain(app.config)
    jobs = jobs_by_email(app, campaign_id)
    assert jobs["ok1@example.com"] == ("sent", None, 1)
    assert jobs["bounce1@example.com"] == ("failed", "bounced", 1)
    assert jobs["gone1@example.com"] == ("failed", "bounced", 1)
    assert jobs["later1@example.com"] == ("failed", "retries_exhausted", 3)  # the send plus max_retries 2
    assert jobs["x@badsender.example"] == ("failed", "sender_rejected", 1)
    # Only the dead mailboxes are suppressed; the sender problem suppresses nobody.
    assert suppressed(app) == {"bounce1@example.com": "bounced", "gone1@example.com": "bounced"}
    with app.db.connection() as conn:
        code = conn.execute("SELECT code, diagnostic FROM suppressions WHERE email = 'bounce1@example.com'").fetchone()
        assert conn.execute("SELECT count(*) FROM pending_bounces").fetchone() == (0,)
        retries = conn.execute("SELECT attempt, outcome, smtp_code, enhanced_code, phase FROM delivery_attempts "
                               "WHERE job_id = (SELECT id FROM broadcast_jobs WHERE email = 'later1@example.com') "
                               "ORDER BY attempt").fetchall()
    assert code == ("550 5.1.1", "550 5.1.1 no such user")
    # The attempt that used up the retries is the job's failure, and campaign log says why.
    assert retries == [(1, "retry", 450, "4.2.0", "rcpt"), (2, "retry", 450, "4.2.0", "rcpt"),
                       (3, "fail", 450, "4.2.0", "rcpt")]
    log = app.delivery_log(campaign_id, email="later1@example.com")
    assert [(r["outcome"], r["reason"]) for r in log] == [("retry", None), ("retry", None),
                                                          ("fail", "retries_exhausted")]
    # The next campaign skips the bounced addresses.
    smtp_sink.handler.rules = []
    second = make_broadcast(app, [], name="Second")
    assert app.campaign_status(second).skipped == 2


def test_readmes_deferral_is_retried_with_backoff_and_delivered_on_the_third_try(app_for, smtp_sink):
    """README's sink example: `later*@* x2=450 4.2.0 ...` defers each address twice. A recipient's
    4.2.0 uses up an attempt each time (a 4.7.1 reads as throttling and did not: the campaign stayed
    sending for days with ATTEMPT 0)."""
    smtp_sink.handler.rules = [FailRule.parse("later*@* x2=450 4.2.0 mailbox busy, try again")]
    app = app_for(fast_settings(smtp_sink.port, retry={"max_retries": 3}))
    campaign_id = make_broadcast(app, ["later1@example.com", "now@example.com"])
    drain(app.config)
    assert jobs_by_email(app, campaign_id) == {"later1@example.com": ("sent", None, 3),
                                               "now@example.com": ("sent", None, 1)}
    assert [r["outcome"] for r in app.delivery_log(campaign_id, email="later1@example.com")] == [
        "retry", "retry", "sent"]


def test_a_deferred_recipient_is_sent_on_retry(app_for, smtp_sink):
    deferred_once: set[str] = set()
    original = smtp_sink.handler.handle_RCPT

    async def flaky(server, session, envelope, address, options):
        if address.startswith("flaky") and address not in deferred_once:
            deferred_once.add(address)
            return "450 4.2.0 mailbox busy, try later"
        return await original(server, session, envelope, address, options)

    smtp_sink.handler.handle_RCPT = flaky
    app = app_for(fast_settings(smtp_sink.port))
    campaign_id = make_broadcast(app, ["flaky1@example.com", "steady@example.com"])
    drain(app.config)
    assert jobs_by_email(app, campaign_id) == {"flaky1@example.com": ("sent", None, 2), "steady@example.com": ("sent", None, 1)}
    assert sorted(r.recipients[0] for r in smtp_sink.received) == ["flaky1@example.com", "steady@example.com"]


def test_a_5xx_to_mail_from_suppresses_nobody(app_for, smtp_sink):
    smtp_sink.handler.rules = [FailRule.parse("mail:*=550 5.7.1 sender blocked by policy")]
    app = app_for(fast_settings(smtp_sink.port))
    campaign_id = make_broadcast(app, [f"user{i}@example.com" for i in range(5)])
    drain(app.config)
    assert set(jobs_by_email(app, campaign_id).values()) == {("failed", "policy_rejected", 1)}
    assert suppressed(app) == {}


def test_consecutive_relay_failures_pause_the_campaign_instead_of_failing_the_list(app_for, smtp_sink):
    smtp_sink.handler.rules = [FailRule.parse("mail:*=554 5.7.1 your IP is on a block list")]
    app = app_for(fast_settings(smtp_sink.port, transport={"name": "smtp", "max_consecutive_failures": 5}, concurrency=1))
    campaign_id = make_broadcast(app, [f"user{i}@example.com" for i in range(30)])
    drain(app.config)
    status = app.campaign_status(campaign_id)
    assert status.status == "paused"
    assert status.paused_reason == "5 consecutive failures: policy_rejected"
    assert status.failed <= 5 + app.config.claim_batch
    assert status.pending >= 20
    assert suppressed(app) == {}


def test_a_relay_refusing_auth_pauses_and_resume_after_the_fix_completes(app_for, monkeypatch):
    from senddock.sink import Sink

    with Sink("127.0.0.1", 0, credentials=("mailer", "right-password")) as relay:
        monkeypatch.setenv("SMTP_PASSWORD", "wrong-password")
        settings = fast_settings(relay.port)
        settings["smtp"].update(username="mailer", password="${SMTP_PASSWORD}")
        app = app_for(settings)
        campaign_id = make_broadcast(app, [f"user{i}@example.com" for i in range(8)])
        drain(app.config)
        status = app.campaign_status(campaign_id)
        assert (status.status, status.paused_reason) == ("paused", "auth_failed")
        assert (status.sent, status.failed, status.pending) == (0, 0, 8)  # no recipient failed or suppressed
        assert suppressed(app) == {}
        assert relay.received == []

        monkeypatch.setenv("SMTP_PASSWORD", "right-password")
        fixed = app_for(settings)
        fixed.resume_campaign(campaign_id)
        drain(fixed.config)
        assert fixed.campaign_status(campaign_id).status == "finished"
        assert sorted(r.recipients[0] for r in relay.received) == sorted(f"user{i}@example.com" for i in range(8))
        with fixed.db.connection() as conn:
            assert conn.execute("SELECT max(attempts) FROM broadcast_jobs").fetchone() == (1,)


def test_a_job_whose_address_was_suppressed_meanwhile_is_not_sent(app_for, smtp_sink):
    app = app_for(fast_settings(smtp_sink.port))
    campaign_id = make_broadcast(app, ["keep@example.com", "drop@example.com"])
    app.suppress("DROP@example.com")
    drain(app.config)
    assert jobs_by_email(app, campaign_id)["drop@example.com"] == ("failed", "suppressed", 0)
    assert [r.recipients[0] for r in smtp_sink.received] == ["keep@example.com"]
    assert app.campaign_status(campaign_id).status == "finished"


def test_smtp_server_down_for_a_while_then_back(app_for):
    from senddock.sink import Sink, free_port

    port = free_port("127.0.0.1")
    app = app_for(fast_settings(port, retry={"schedule": ["1s"], "max_retries": 10, "jitter": 0}))
    campaign_id = make_broadcast(app, [f"user{i}@example.com" for i in range(10)])
    from senddock.core.runner import Runner

    Runner(app.config, exit_when_idle=True).run()  # nobody listens: every job is retried
    status = app.campaign_status(campaign_id)
    assert status.retry == 10 and status.sent == 0
    with Sink("127.0.0.1", port) as sink:
        drain(app.config)
        assert sorted(r.recipients[0] for r in sink.received) == sorted(f"user{i}@example.com" for i in range(10))
    assert app.campaign_status(campaign_id).status == "finished"


def test_idle_workers_wake_on_new_work_without_waiting_for_the_poll(app_for, smtp_sink):
    import threading
    import time

    from senddock.core.runner import Runner

    app = app_for(fast_settings(smtp_sink.port, poll_interval="60s"))
    runner = Runner(app.config)
    thread = threading.Thread(target=runner.run)
    thread.start()
    try:
        time.sleep(1.0)  # the workers have found nothing and wait for the (60 s) poll
        make_broadcast(app, ["early@example.com"])
        deadline = time.monotonic() + 20
        while not smtp_sink.received and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [r.recipients[0] for r in smtp_sink.received] == ["early@example.com"]
    finally:
        runner.request_stop()
        thread.join(30)


def test_a_connection_break_after_a_claim_puts_its_jobs_back_not_in_doubt(app_for, smtp_sink, monkeypatch):
    """The claimer's connection breaks after its claim committed (the jobs marked begun), before any
    of them reached a sender: on its next connection it puts them back as they were (no in-doubt
    attempt, no attempt counted) and everyone still gets exactly one message."""
    import psycopg

    from senddock.core.content import ContentCache

    app = app_for(fast_settings(smtp_sink.port, concurrency=5, claim_batch=5))
    campaign_id = make_broadcast(app, [f"user{i}@example.com" for i in range(5)])
    original, calls = ContentCache.load, []

    def breaking(self, queue, campaign_ids):
        calls.append(campaign_ids)
        if len(calls) == 1:
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        return original(self, queue, campaign_ids)

    monkeypatch.setattr(ContentCache, "load", breaking)
    drain(app.config)
    assert len(calls) >= 2
    assert Counter(r.recipients[0] for r in smtp_sink.received) == Counter(f"user{i}@example.com" for i in range(5))
    with app.db.connection() as conn:
        assert conn.execute("SELECT count(*) FROM delivery_attempts WHERE in_doubt").fetchone() == (0,)
        assert conn.execute("SELECT max(attempts) FROM broadcast_jobs").fetchone() == (1,)
    assert app.campaign_status(campaign_id).status == "finished"


def test_a_result_whose_commit_reply_was_lost_is_not_recorded_twice(app_for, monkeypatch):
    """The commit of a result succeeds but the connection dies before its reply: the worker
    retries on a new connection, finds its result there, and neither logs a second attempt nor
    mistakes its own result for a lost claim (the pause it carries is applied)."""
    import psycopg

    from senddock.store.jobs import JobQueue
    from senddock.sink import Sink

    with Sink("127.0.0.1", 0, credentials=("mailer", "right-password")) as relay:
        monkeypatch.setenv("SMTP_PASSWORD", "wrong-password")
        settings = fast_settings(relay.port, concurrency=1)
        settings["smtp"].update(username="mailer", password="${SMTP_PASSWORD}")
        app = app_for(settings)
        campaign_id = make_broadcast(app, ["a@example.com", "b@example.com"])
        original, calls = JobQueue.commit_group, []

        def commit_then_lose_the_reply(self, *args, **kwargs):
            committed = original(self, *args, **kwargs)
            if committed.recorded:  # not a group of jobs put back unsent (the pause's next job)
                calls.append(committed)
                if len(calls) == 1:
                    raise psycopg.OperationalError("server closed the connection unexpectedly")
            return committed

        monkeypatch.setattr(JobQueue, "commit_group", commit_then_lose_the_reply)
        drain(app.config)
    assert len(calls) == 1  # the retry found the committed result instead of writing it again
    status = app.campaign_status(campaign_id)
    assert (status.status, status.paused_reason, status.pending) == ("paused", "auth_failed", 2)
    with app.db.connection() as conn:
        attempts = conn.execute("SELECT outcome, claim_lost FROM delivery_attempts").fetchall()
    assert attempts == [("pause", False)]


def test_a_connection_lost_in_the_aftermath_of_a_commit_still_finishes_it(app_for, smtp_sink, monkeypatch):
    """The bounce breaker's check after a group commit loses its connection: the completer finishes
    that group's aftermath on its next connection, once (the bounce checked once more is all: its
    hooks run once), gives the group's slots and claims back, and the node goes idle and exits
    (before, the group's slots and claims stayed taken and the node never went idle)."""
    from senddock.store.jobs import JobQueue

    smtp_sink.handler.rules = [FailRule.parse("bounce*@*=550 5.1.1 no such user")]
    app = app_for(fast_settings(smtp_sink.port, concurrency=2))
    emails = ["ok1@example.com", "bounce1@example.com", "ok2@example.com", "ok3@example.com"]
    campaign_id = make_broadcast(app, emails)
    checks = []
    monkeypatch.setattr(JobQueue, "bounce_check", losing_the_connection_once(JobQueue.bounce_check, checks))
    run_until_idle(app.config, "the node never went idle: the group's slots or claims were never given back")
    assert len(checks) == 2  # the lost one, then the retry
    assert_sent_but_one_bounce(app, campaign_id, emails)


def test_a_connection_lost_in_the_aftermath_of_a_settled_commit_still_finishes_it(app_for, smtp_sink, monkeypatch):
    """A group's commit loses its reply, and on the next connection, where the completer finds the
    group committed, the aftermath (the bounce breaker's check) loses that connection too: the
    group's aftermath is finished on the connection after, once, as after a commit whose reply
    came (before, the settled group was dropped with its slots and claims taken: the node never
    went idle, and the bounce was never checked)."""
    import psycopg

    from senddock.store.jobs import JobQueue

    smtp_sink.handler.rules = [FailRule.parse("bounce*@*=550 5.1.1 no such user")]
    app = app_for(fast_settings(smtp_sink.port, concurrency=1))
    emails = ["ok1@example.com", "bounce1@example.com", "ok2@example.com"]
    campaign_id = make_broadcast(app, emails)
    commit_group, commits, checks = JobQueue.commit_group, [], []

    def commit_then_lose_the_reply(self, rows, *args, **kwargs):
        committed = commit_group(self, rows, *args, **kwargs)
        if any(row.result.bounce for row in rows):
            commits.append(rows)
            if len(commits) == 1:
                raise psycopg.OperationalError("server closed the connection unexpectedly")
        return committed

    monkeypatch.setattr(JobQueue, "commit_group", commit_then_lose_the_reply)
    monkeypatch.setattr(JobQueue, "bounce_check", losing_the_connection_once(JobQueue.bounce_check, checks))
    run_until_idle(app.config, "the node never went idle: the settled group's slots or claims were never given back")
    assert len(commits) == 1  # the settle found the group committed: not committed again
    assert len(checks) == 2  # the lost one, then the retry
    assert_sent_but_one_bounce(app, campaign_id, emails)


def test_a_node_told_to_exit_when_idle_exits_once_the_work_is_done_not_at_its_next_poll(app_for, smtp_sink):
    """With `--exit-when-idle` the node looks as soon as its last results are committed and handled,
    not at its next poll (up to `poll_interval` later: a script waited that long for nothing)."""
    from senddock.core.runner import Runner

    app = app_for(fast_settings(smtp_sink.port, poll_interval="5s"))
    campaign_id = make_broadcast(app, ["a@example.com", "b@example.com", "c@example.com"])
    Runner(app.config, exit_when_idle=True).run()
    exited = time.time()
    assert app.campaign_status(campaign_id).status == "finished"
    last = max(message.at for message in smtp_sink.received)
    assert exited - last < 4.0, f"exited {exited - last:.1f}s after the last message (poll_interval 5s)"


def test_retry_max_age_is_measured_on_the_databases_clock_alone(app_for, smtp_sink, monkeypatch):
    """A node whose clock is two hours ahead of the database's must not expire a job that is ten
    minutes old (the age used to be this node's clock minus the database's first-attempt time)."""
    import datetime as real

    import senddock.core.senders as worker_module

    class AheadClock(real.datetime):
        @classmethod
        def now(cls, tz=None):
            return real.datetime.now(tz) + real.timedelta(hours=2)

    monkeypatch.setattr(worker_module, "datetime", AheadClock)
    smtp_sink.handler.rules = [FailRule.parse("busy@*=450 4.2.0 mailbox busy")]
    app = app_for(fast_settings(smtp_sink.port, retry={"schedule": ["1h"], "max_retries": 5, "jitter": 0,
                                                       "max_age": "1h30m"}))
    campaign_id = make_broadcast(app, ["busy@example.com"])
    with app.db.connection() as conn:
        conn.execute("UPDATE broadcast_jobs SET status = 'retry', attempts = 1, "
                     "first_attempt_at = now() - interval '10 minutes', next_attempt_at = now()")
    Runner(app.config, exit_when_idle=True).run()  # one pass: the retry is due in an hour
    # Retried again in an hour (10 minutes + 1 hour is within 1h30m), not failed as expired.
    assert jobs_by_email(app, campaign_id)["busy@example.com"] == ("retry", None, 2)
