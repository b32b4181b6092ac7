"""Retention (issue 35): an ended broadcast's per-recipient rows go, its campaign keeps exactly the
counts it showed; old inbound mail records and status history go by age; nothing else is touched,
and a prune killed half-way leaves each campaign whole or pruned with its counts."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections import Counter

import psycopg
import pytest
from tests_support import make_broadcast, senddock_executable, wait_for

from senddock.api import Senddock
from senddock.errors import InvalidState
from senddock.testing import drain, fast_settings

PER_BROADCAST = ("broadcast_jobs", "delivery_attempts", "delivery_events", "claim_floors", "claim_putbacks")
REASONS = ("bounced", "retries_exhausted", "cancelled", "in_doubt", "rejected", None)


def rows_of(conn: psycopg.Connection, broadcast_id: int) -> dict[str, int]:
    return {table: conn.execute(f"SELECT count(*) FROM {table} WHERE broadcast_id = %s", (broadcast_id,)).fetchone()[0]
            for table in PER_BROADCAST}


def ended_with_every_outcome(app: Senddock, dsn: str, *, status: str = "finished", name: str = "Launch",
                             list_name: str = "news") -> tuple[int, int]:
    """A campaign whose broadcast's jobs ended in every status a campaign can end with and every
    failure reason, with attempts, bounces and complaints told after the send, and a suppression
    its bounce made; returns (campaign id, broadcast id)."""
    emails = [f"{list_name}{i}@example.com" for i in range(40)]
    campaign_id = make_broadcast(app, emails, name=name, list_name=list_name)
    broadcast_id = app.campaign_status(campaign_id).broadcast_id
    with psycopg.connect(dsn, autocommit=True) as conn:
        ids = [row[0] for row in conn.execute("SELECT id FROM broadcast_jobs WHERE broadcast_id = %s ORDER BY id",
                                              (broadcast_id,))]
        conn.execute("UPDATE broadcast_jobs SET status = 'sent', attempts = 1, provider_message_id = 'p-' || id "
                     "WHERE id = ANY(%s)", (ids[:30],))
        for offset, reason in enumerate(REASONS):
            conn.execute("UPDATE broadcast_jobs SET status = 'failed', failure_reason = %s, attempts = 1 WHERE id = %s",
                         (reason, ids[30 + offset]))
        conn.execute("UPDATE broadcast_jobs SET status = 'failed', failure_reason = 'cancelled' WHERE id = ANY(%s)",
                     (ids[36:],))
        conn.execute("INSERT INTO delivery_attempts (job_id, broadcast_id, attempt, node, started_at, outcome) "
                     "SELECT id, broadcast_id, 1, 'history', now(), CASE WHEN status = 'sent' THEN 'sent' ELSE 'failed' END "
                     "FROM broadcast_jobs WHERE broadcast_id = %s AND attempts > 0", (broadcast_id,))
        events = [("hard", ids[0], "bounce", "Permanent", True), ("soft", ids[1], "bounce", "Transient", False),
                  ("soft2", ids[2], "bounce", "Undetermined", False), ("abuse", ids[3], "complaint", None, True)]
        for key, job_id, kind, bounce_type, suppresses in events:
            conn.execute("INSERT INTO delivery_events (event_key, job_id, broadcast_id, email, kind, bounce_type, "
                         "suppresses, hooks_done) SELECT %s, id, broadcast_id, email, %s, %s, %s, true "
                         "FROM broadcast_jobs WHERE id = %s", (f"{list_name}-{key}", kind, bounce_type, suppresses, job_id))
        conn.execute("INSERT INTO suppressions (email, reason, source_broadcast_id) "
                     "SELECT email, 'bounced', broadcast_id FROM broadcast_jobs WHERE id = %s", (ids[0],))
        conn.execute("UPDATE campaigns SET status = %s, finished_at = now() WHERE id = %s", (status, campaign_id))
    return campaign_id, broadcast_id


@pytest.mark.parametrize("ended", ["finished", "cancelled"])
def test_a_pruned_campaign_shows_exactly_the_counts_it_had(senddock_app, database_dsn, cli, ended):
    campaign_id, broadcast_id = ended_with_every_outcome(senddock_app, database_dsn, status=ended)
    before = senddock_app.campaign_status(campaign_id)
    assert before.failed_by_reason and before.later_hard == 1 and before.later_soft == 2 and before.complaints == 1
    shown_before = cli("campaign", "status", campaign_id, "--json", "-c", senddock_app.config.path).json
    assert shown_before["pruned_at"] is None

    pruned = senddock_app.prune_campaign(campaign_id)

    assert pruned.rows == {"broadcast_jobs": 40, "delivery_attempts": 36, "delivery_events": 4, "claim_floors": 0}
    with psycopg.connect(database_dsn) as conn:
        assert rows_of(conn, broadcast_id) == dict.fromkeys(PER_BROADCAST, 0)
        assert conn.execute("SELECT count(*) FROM suppressions").fetchone()[0] == 1  # never pruned
        assert conn.execute("SELECT count(*) FROM subscribers").fetchone()[0] == 40
    after = senddock_app.campaign_status(campaign_id)
    assert after.pruned_at == pruned.pruned_at is not None
    assert {**after.as_dict(), "pruned_at": None} == before.as_dict()
    shown_after = cli("campaign", "status", campaign_id, "--json", "-c", senddock_app.config.path).json
    assert {**shown_after, "pruned_at": None} == shown_before
    human = cli("campaign", "status", campaign_id, "-c", senddock_app.config.path)
    assert "detail pruned on" in human.stdout
    log = cli("campaign", "log", campaign_id, "-c", senddock_app.config.path)
    assert log.exit_code == 0 and "per-recipient detail was pruned on" in log.stdout
    assert cli("campaign", "log", campaign_id, "--json", "-c", senddock_app.config.path).json["pruned_at"] is not None
    with pytest.raises(InvalidState, match="was pruned on"):
        senddock_app.prune_campaign(campaign_id)


def test_only_an_ended_campaign_without_sends_in_flight_is_pruned(senddock_app, database_dsn, cli):
    campaign_id = make_broadcast(senddock_app, ["a@example.com", "b@example.com"])
    refused = cli("prune", "--campaign", campaign_id, "-c", senddock_app.config.path)
    assert refused.exit_code == 1 and "is sending: only an ended" in refused.stderr
    with psycopg.connect(database_dsn, autocommit=True) as conn:
        conn.execute("UPDATE broadcast_jobs SET status = 'sending' WHERE email = 'a@example.com'")
        conn.execute("UPDATE campaigns SET status = 'cancelled', finished_at = now() WHERE id = %s", (campaign_id,))
    in_flight = cli("prune", "--campaign", campaign_id, "--json", "-c", senddock_app.config.path)
    assert in_flight.exit_code == 1 and "has 1 sends in flight" in in_flight.stderr
    with psycopg.connect(database_dsn, autocommit=True) as conn:
        conn.execute("UPDATE broadcast_jobs SET status = 'failed', failure_reason = 'cancelled'")
    dry = cli("prune", "--campaign", campaign_id, "--dry-run", "--json", "-c", senddock_app.config.path).json
    assert dry["dry_run"] and dry["pruned"][0]["rows"]["broadcast_jobs"] == 2
    assert senddock_app.campaign_status(campaign_id).pruned_at is None  # a dry run changes nothing
    done = cli("prune", "--campaign", campaign_id, "-c", senddock_app.config.path)
    assert done.exit_code == 0 and "pruned campaign" in done.stdout and "2 rows of broadcast_jobs" in done.stdout
    assert cli("prune", "--campaign", 999, "-c", senddock_app.config.path).exit_code == 1


def test_prune_takes_what_the_retention_says_is_due_and_nothing_else(make_config, database_dsn, cli):
    app = Senddock(make_config(fast_settings(2525, retention={"broadcasts": "30d", "inbound_mail": "90d",
                                                             "campaign_events": "1y"})))
    old, old_broadcast = ended_with_every_outcome(app, database_dsn, name="Old", list_name="old")
    recent, recent_broadcast = ended_with_every_outcome(app, database_dsn, name="Recent", list_name="recent")
    sending = make_broadcast(app, ["s@example.com"], name="Sending", list_name="live")
    with psycopg.connect(database_dsn, autocommit=True) as conn:
        conn.execute("UPDATE campaigns SET finished_at = now() - interval '31 days' WHERE id = %s", (old,))
        conn.execute("UPDATE campaigns SET finished_at = now() - interval '29 days' WHERE id = %s", (recent,))
        conn.execute("INSERT INTO inbound_mail (mail_key, via, kind, outcome, size, received_at) VALUES "
                     "('old', 'fetch', 'hard', 'applied', 10, now() - interval '91 days'), "
                     "('new', 'fetch', 'hard', 'applied', 10, now() - interval '89 days')")
        conn.execute("INSERT INTO campaign_events (campaign_id, at, to_status) VALUES "
                     "(%s, now() - interval '400 days', 'sending')", (old,))
        history = conn.execute("SELECT count(*) FROM campaign_events").fetchone()[0]

    dry = cli("prune", "--dry-run", "--json", "-c", app.config.path).json
    assert [p["campaign_id"] for p in dry["pruned"]] == [old] and dry["expired"] == {"inbound_mail": 1,
                                                                                    "campaign_events": 1}
    result = cli("prune", "--json", "-c", app.config.path).json
    assert result["dry_run"] is False and [p["campaign_id"] for p in result["pruned"]] == [old]
    assert result["pruned"][0]["rows"]["broadcast_jobs"] == 40 and result["expired"] == dry["expired"]
    with psycopg.connect(database_dsn) as conn:
        assert rows_of(conn, old_broadcast)["broadcast_jobs"] == 0
        assert rows_of(conn, recent_broadcast)["broadcast_jobs"] == 40
        assert conn.execute("SELECT array_agg(mail_key) FROM inbound_mail").fetchone()[0] == ["new"]
        assert conn.execute("SELECT count(*) FROM campaign_events").fetchone()[0] == history - 1
    assert app.campaign_status(sending).status == "sending" and app.campaign_status(sending).pending == 1
    assert cli("prune", "--json", "-c", app.config.path).json["pruned"] == []  # nothing more is due
    assert "nothing is due" in cli("prune", "-c", app.config.path).stdout
    app.close()


def test_forever_keeps_everything(make_config, database_dsn, cli):
    app = Senddock(make_config(fast_settings(2525, retention={"broadcasts": "forever", "inbound_mail": "forever",
                                                             "campaign_events": "forever"})))
    campaign_id, _ = ended_with_every_outcome(app, database_dsn)
    with psycopg.connect(database_dsn, autocommit=True) as conn:
        conn.execute("UPDATE campaigns SET finished_at = now() - interval '10 years' WHERE id = %s", (campaign_id,))
    assert cli("prune", "--json", "-c", app.config.path).json == {"dry_run": False, "pruned": [], "skipped": [], "expired": {},
                                           "bytes_returned": 0}
    app.close()


def test_pruning_while_a_campaign_of_the_same_list_sends(make_config, database_dsn, smtp_sink):
    app = Senddock(make_config(fast_settings(smtp_sink.port)))
    old, old_broadcast = ended_with_every_outcome(app, database_dsn)
    emails = [f"news{i}@example.com" for i in range(40)] + [f"late{i}@example.com" for i in range(400)]
    live = make_broadcast(app, emails, name="Second")  # the same list, and more
    suppressed_one = 1  # the first campaign's bounce suppressed news0
    sender = threading.Thread(target=drain, args=(app.config,))
    sender.start()
    try:
        wait_for(lambda: len(smtp_sink.received) > 20, 30, "the second campaign to send")
        pruned = app.prune_campaign(old)
    finally:
        sender.join(60)
    assert pruned.rows["broadcast_jobs"] == 40
    status = app.campaign_status(live)
    assert status.status == "finished" and status.sent == len(emails) - suppressed_one
    assert max(Counter(r.recipients[0] for r in smtp_sink.received).values()) == 1
    with psycopg.connect(database_dsn) as conn:
        assert rows_of(conn, old_broadcast)["broadcast_jobs"] == 0
    app.close()


def start_prune(campaign_id: int, dsn: str, config) -> subprocess.Popen:
    return subprocess.Popen([senddock_executable(), "prune", "--campaign", str(campaign_id), "-c", str(config)],
                            env={**os.environ, "SENDDOCK_DATABASE_URL": dsn},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def waiting_on(conn: psycopg.Connection, statement: str) -> bool:
    return conn.execute("SELECT EXISTS (SELECT FROM pg_stat_activity WHERE query ILIKE %s AND wait_event_type = 'Lock')",
                        (f"%{statement}%",)).fetchone()[0]


def kill(process: subprocess.Popen) -> None:
    assert process.poll() is None, "the prune ended before it could be killed"
    process.send_signal(signal.SIGKILL)
    process.wait(10)


def test_a_prune_killed_half_way_leaves_the_campaign_whole_or_pruned(senddock_app, database_dsn, config_file):
    """kill -9 of `senddock prune --campaign` at each of its two steps. Before its commit (here
    waiting for the campaign's row): the campaign is untouched. After it, while the partitions are
    detached (here waiting for a reader of them): the campaign is pruned with its counts, and the
    next prune drops what is left of its partitions."""
    campaign_id, broadcast_id = ended_with_every_outcome(senddock_app, database_dsn)
    expected = senddock_app.campaign_status(campaign_id).as_dict()
    with psycopg.connect(database_dsn, autocommit=True) as watch, psycopg.connect(database_dsn) as holder:
        before = rows_of(watch, broadcast_id)
        holder.execute("SELECT FROM campaigns WHERE id = %s FOR UPDATE", (campaign_id,))
        prune = start_prune(campaign_id, database_dsn, config_file)
        wait_for(lambda: waiting_on(watch, "FOR UPDATE") or prune.poll() is not None, 30, "the prune to wait")
        kill(prune)
        holder.rollback()
        assert senddock_app.campaign_status(campaign_id).as_dict() == expected
        assert rows_of(watch, broadcast_id) == before, "rows went without their counts being frozen"

        holder.execute("SELECT count(*) FROM broadcast_jobs WHERE broadcast_id = %s", (broadcast_id,))  # a reader
        prune = start_prune(campaign_id, database_dsn, config_file)
        wait_for(lambda: waiting_on(watch, "DETACH PARTITION") or prune.poll() is not None, 30,
                 "the prune to wait to detach")
        kill(prune)
        holder.rollback()
        status = senddock_app.campaign_status(campaign_id)
        assert status.pruned_at is not None and {**status.as_dict(), "pruned_at": None} == expected
        left = watch.execute("SELECT count(*) FROM pg_class WHERE relname IN (%s, %s)",
                             (f"broadcast_jobs_b{broadcast_id}", f"delivery_attempts_b{broadcast_id}")).fetchone()[0]
        assert left == 2, "the partitions were dropped before the kill: the test proves nothing"
    finished = senddock_app.prune()  # the next prune finishes the drops
    assert finished.bytes_returned > 0 and finished.pruned == []
    with psycopg.connect(database_dsn) as conn:
        assert rows_of(conn, broadcast_id) == dict.fromkeys(PER_BROADCAST, 0)
        assert conn.execute("SELECT count(*) FROM pg_class WHERE relname LIKE %s",
                            (f"%\\_b{broadcast_id}",)).fetchone()[0] == 0
    assert {**senddock_app.campaign_status(campaign_id).as_dict(), "pruned_at": None} == expected


def test_a_node_prunes_what_is_due_by_itself(make_config, database_dsn):
    from senddock.core.runner import Runner

    app = Senddock(make_config(fast_settings(2525, retention={"broadcasts": "1d", "every": "200ms"})))
    campaign_id, broadcast_id = ended_with_every_outcome(app, database_dsn)
    expected = app.campaign_status(campaign_id).as_dict()
    with psycopg.connect(database_dsn, autocommit=True) as conn:
        conn.execute("UPDATE campaigns SET finished_at = now() - interval '2 days' WHERE id = %s", (campaign_id,))
    runner = Runner(app.config, node_name="keeper")
    thread = threading.Thread(target=runner.run)
    thread.start()
    try:
        wait_for(lambda: app.campaign_status(campaign_id).pruned_at is not None, 30, "the node to prune")
    finally:
        runner.request_stop()
        thread.join(30)
    assert {**app.campaign_status(campaign_id).as_dict(), "pruned_at": None} == expected
    with psycopg.connect(database_dsn) as conn:
        assert rows_of(conn, broadcast_id) == dict.fromkeys(PER_BROADCAST, 0)
    pruned = {s.labels["table"]: s.value for m in runner.metrics.registry.collect() if m.name == "senddock_pruned_rows"
              for s in m.samples if s.name == "senddock_pruned_rows_total"}
    assert pruned["broadcast_jobs"] == 40 and pruned["delivery_attempts"] == 36
    app.close()
