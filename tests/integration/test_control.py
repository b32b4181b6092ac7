"""Operating a broadcast in flight: pause and resume across two nodes, cancel, schedule, requeue."""

from __future__ import annotations

import threading
import time
from collections import Counter
from datetime import datetime, timedelta, timezone

import pytest

from senddock.api import Senddock
from senddock.core.inflight import RUNWAY
from senddock.core.runner import Runner
from senddock.errors import InvalidInput, InvalidState
from senddock.sink import FailRule
from senddock.testing import drain, fast_settings
from tests_support import (jobs_by_email, make_broadcast, sent_count, start_node, still_true, suppressed, wait_for,
                           write_config)


def delivered(sink) -> Counter:
    return Counter(r.recipients[0] for r in sink.received)


def stop(nodes) -> None:
    for node in nodes:
        node.terminate()
        _, stderr = node.communicate(timeout=60)
        assert node.returncode == 0, stderr.decode()[-3000:]


def test_pause_then_resume_across_two_nodes_sends_everyone_exactly_once(make_config, database_dsn, smtp_sink, tmp_path):
    settings = fast_settings(smtp_sink.port, concurrency=3)
    app = Senddock(make_config(settings))
    emails = [f"user{i}@example.com" for i in range(2000)]
    campaign_id = make_broadcast(app, emails)
    config_path = write_config(tmp_path, settings)
    nodes = [start_node(config_path, database_dsn, name) for name in ("east", "west")]
    try:
        wait_for(lambda: sent_count(database_dsn) > 200, 60, "both nodes sending")
        app.pause_campaign(campaign_id)
        # The sends in flight at the pause finish and are recorded: no job of it is claimed then.
        wait_for(lambda: app.campaign_status(campaign_id).sending == 0, 30, "the sends in flight to be recorded")
        paused_at = len(smtp_sink.received)
        # Both nodes look for work every poll interval (100 ms): ten of them claim nothing of it.
        assert still_true(lambda: len(smtp_sink.received) == paused_at, 10 * 0.1), "a paused campaign kept sending"
        status = app.campaign_status(campaign_id)
        assert status.status == "paused" and status.sending == 0 and status.sent == paused_at < 2000

        app.resume_campaign(campaign_id)
        wait_for(lambda: app.campaign_status(campaign_id).status == "finished", 120, "the resumed campaign to finish")
    finally:
        stop(nodes)
    counts = delivered(smtp_sink)
    assert set(counts) == set(emails) and max(counts.values()) == 1
    app.close()


def test_cancel_mid_flight_sends_nothing_more(make_config, database_dsn, smtp_sink, tmp_path):
    settings = fast_settings(smtp_sink.port, concurrency=3)
    app = Senddock(make_config(settings))
    campaign_id = make_broadcast(app, [f"user{i}@example.com" for i in range(2000)])
    nodes = [start_node(write_config(tmp_path, settings), database_dsn, "solo")]
    try:
        wait_for(lambda: sent_count(database_dsn) > 100, 60, "the node sending")
        cancelled = app.cancel_campaign(campaign_id)
        at_cancel = len(smtp_sink.received)
        # Sends that had begun when the cancel committed may finish: at most one per send slot
        # (per worker, and each worker's next job, marked begun while it sent: inflight.RUNWAY).
        # Once none is left sending, ten poll intervals of the node's claim nothing more.
        wait_for(lambda: app.campaign_status(campaign_id).sending == 0, 30, "the sends in flight to end")
        assert still_true(lambda: len(smtp_sink.received) <= at_cancel + RUNWAY * 3, 10 * 0.1)
    finally:
        stop(nodes)
    status = app.campaign_status(campaign_id)
    assert status.status == "cancelled"
    assert status.sent == len(smtp_sink.received)
    assert status.failed_by_reason == {"cancelled": 2000 - status.sent}
    assert cancelled <= 2000 - status.sent
    assert (status.pending, status.retry, status.sending) == (0, 0, 0)
    with pytest.raises(InvalidState, match="is cancelled: there is nothing left to cancel"):
        app.cancel_campaign(campaign_id)
    app.close()


def test_a_scheduled_send_starts_at_its_time(make_config, smtp_sink):
    app = Senddock(make_config(fast_settings(smtp_sink.port)))
    campaign_id = make_broadcast(app, [f"user{i}@example.com" for i in range(20)], send=False)
    at = datetime.now(timezone.utc) + timedelta(seconds=3)
    result = app.send_campaign(campaign_id, send_at=at)
    assert result.enqueued == 20
    assert app.campaign_status(campaign_id).status == "scheduled"
    runner = Runner(app.config)
    thread = threading.Thread(target=runner.run)
    thread.start()
    try:
        while datetime.now(timezone.utc) < at - timedelta(milliseconds=300):
            assert smtp_sink.received == [], "sent before its time"
            time.sleep(0.1)
        wait_for(lambda: app.campaign_status(campaign_id).status == "finished", 30, "the scheduled campaign")
    finally:
        runner.request_stop()
        thread.join(30)
    assert len(smtp_sink.received) == 20
    with app.db.connection() as conn:
        first = conn.execute("SELECT min(started_at) FROM delivery_attempts").fetchone()[0]
    assert first >= at
    [summary] = [c for c in app.campaigns() if c.id == campaign_id]
    assert summary.send_at == at
    app.close()


def test_requeue_after_fixing_the_relay_never_touches_bounces(make_config, smtp_sink):
    smtp_sink.handler.rules = [FailRule.parse("bounce*@*=550 5.1.1 no such user"),
                               FailRule.parse("mail:*=554 5.7.1 your IP is on a block list")]
    app = Senddock(make_config(fast_settings(smtp_sink.port, transport={"name": "smtp", "max_consecutive_failures": 1000})))
    campaign_id = make_broadcast(app, ["a@example.com", "b@example.com", "bounce1@example.com"])
    drain(app.config)
    assert app.campaign_status(campaign_id).failed_by_reason == {"policy_rejected": 3}
    with pytest.raises(InvalidInput, match="never requeued"):
        app.requeue_campaign(campaign_id, "bounced")

    smtp_sink.handler.rules = [FailRule.parse("bounce*@*=550 5.1.1 no such user")]  # the block is lifted
    assert app.requeue_campaign(campaign_id, "policy_rejected") == 3
    assert app.campaign_status(campaign_id).status == "sending"
    drain(app.config)
    jobs = jobs_by_email(app, campaign_id)
    assert jobs["a@example.com"][:2] == ("sent", None) and jobs["b@example.com"][:2] == ("sent", None)
    assert jobs["bounce1@example.com"][:2] == ("failed", "bounced")
    assert suppressed(app) == {"bounce1@example.com": "bounced"}
    assert app.campaign_status(campaign_id).status == "finished"
    # Nothing left of that reason: refused, naming what there is; nothing changes, it stays finished.
    with pytest.raises(InvalidInput, match="no jobs that failed as policy_rejected; its failed jobs by reason: none "
                                           "that can be requeued; never requeued .*: bounced 1"):
        app.requeue_campaign(campaign_id, "policy_rejected")
    assert app.campaign_status(campaign_id).status == "finished"
    with app.db.connection() as conn:
        assert conn.execute("SELECT finished_at IS NOT NULL FROM broadcasts").fetchone() == (True,)
    app.close()


def test_requeue_keeps_a_paused_campaign_paused(make_config, smtp_sink):
    smtp_sink.handler.rules = [FailRule.parse("mail:*=554 5.7.1 your IP is on a block list")]
    app = Senddock(make_config(fast_settings(smtp_sink.port, transport={"name": "smtp", "max_consecutive_failures": 2},
                                             concurrency=1)))
    campaign_id = make_broadcast(app, [f"user{i}@example.com" for i in range(6)])
    drain(app.config)
    status = app.campaign_status(campaign_id)
    assert status.status == "paused" and status.failed_by_reason.get("policy_rejected", 0) >= 1
    with pytest.raises(InvalidInput, match="no jobs that failed as typo_reason; its failed jobs by reason: "
                                           "policy_rejected"):
        app.requeue_campaign(campaign_id, "typo_reason")
    assert app.requeue_campaign(campaign_id, "policy_rejected") >= 1
    after = app.campaign_status(campaign_id)
    assert (after.status, after.paused_reason) == ("paused", status.paused_reason)  # resume decides
    app.close()


@pytest.mark.parametrize(("action", "message"), [
    ("resume", "campaign 1 is a draft, not paused"),
    ("pause", "campaign 1 is a draft: only a sending or scheduled campaign can be paused"),
    ("requeue", "campaign 1 is a draft: only a sending, paused or finished campaign can be requeued"),
])
def test_a_campaign_in_the_wrong_state_gets_a_clear_error(make_config, action, message):
    app = Senddock(make_config(fast_settings()))
    campaign_id = make_broadcast(app, ["a@example.com"], send=False)
    call = {"resume": lambda: app.resume_campaign(campaign_id), "pause": lambda: app.pause_campaign(campaign_id),
            "requeue": lambda: app.requeue_campaign(campaign_id, "rejected")}[action]
    with pytest.raises(InvalidState, match=message):
        call()
    app.close()
