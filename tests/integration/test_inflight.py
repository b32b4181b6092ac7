"""Many sends in flight on few connections: the group commit's fencing, the connection bound, and
kill -9 with hundreds of sends in flight."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from dataclasses import replace
from pathlib import Path

import psycopg
import pytest

from senddock.api import Senddock
from senddock.core.completer import LINGER_IN_FLIGHT
from senddock.core.inflight import RUNWAY
from senddock.store.jobs import JobResult, JobQueue, ResultRow
from senddock.testing import drain, fast_settings
from tests_support import duplicates_and_in_doubt, kill_while_sending, make_broadcast, register, start_node, write_config

SENT = JobResult(status="sent", outcome="sent", counts=True, ok=True, last_result="250 ok")
RETRY = JobResult(status="retry", outcome="retry", counts=True, delay=60, last_result="451 try later")
PAUSE = JobResult(status="pending", outcome="pause", counts=False, last_result="535 auth failed")


def test_one_group_commit_fences_each_result_by_its_own_claim(senddock_app, database_dsn):
    """Four results in one statement: one still ours (applies), one whose claim another node took
    over (its retry changes nothing, its attempt says claim_lost), one delivered under a lost claim
    (marked sent all the same, in doubt), and a pause (the campaign pauses in the same commit)."""
    emails = ["own@example.com", "taken@example.com", "late@example.com", "pause@example.com"]
    campaign_id = make_broadcast(senddock_app, emails)
    with psycopg.connect(database_dsn, autocommit=True) as conn_a, psycopg.connect(database_dsn, autocommit=True) as conn_b:
        slow, fast = register(conn_a, "slow"), register(conn_b, "fast")
        mine = {j.email: j for j in JobQueue(conn_a, slow).claim(4, begun=True)}
        assert all(j.send_begun for j in mine.values())
        # The slow node's claims of two jobs were taken over meanwhile (its lease ran out).
        conn_b.execute("UPDATE broadcast_jobs SET claim_token = %s, claimed_by = %s WHERE email = ANY(%s)",
                       (uuid.uuid4(), fast.id, ["taken@example.com", "late@example.com"]))
        rows = [ResultRow(mine["own@example.com"], 1, None, SENT),
                ResultRow(mine["taken@example.com"], 1, None, RETRY),
                ResultRow(mine["late@example.com"], 1, None, SENT),
                ResultRow(mine["pause@example.com"], 0, None, PAUSE, pause_reason="auth_failed")]
        recorded = JobQueue(conn_a, slow).record_results(rows)
        by_email = {e: recorded[mine[e].id] for e in emails}
        jobs = dict(conn_a.execute("SELECT email, status FROM broadcast_jobs").fetchall())
        log = {r[0]: r[1:] for r in conn_a.execute(
            "SELECT j.email, a.outcome, a.claim_lost, a.in_doubt FROM delivery_attempts a "
            "JOIN broadcast_jobs j ON j.id = a.job_id")}
        campaign = conn_a.execute("SELECT status, paused_reason FROM campaigns WHERE id = %s", (campaign_id,)).fetchone()
    assert {e: (r.recorded, r.late_sent) for e, r in by_email.items()} == {
        "own@example.com": (True, False), "taken@example.com": (False, False),
        "late@example.com": (False, True), "pause@example.com": (True, False)}
    assert by_email["pause@example.com"].paused_now
    assert jobs == {"own@example.com": "sent", "taken@example.com": "sending", "late@example.com": "sent",
                    "pause@example.com": "pending"}
    assert log == {"own@example.com": ("sent", False, False), "taken@example.com": ("retry", True, False),
                   "late@example.com": ("sent", True, True), "pause@example.com": ("pause", False, False)}
    assert campaign == ("paused", "auth_failed")


def test_a_group_commit_names_the_campaigns_stopped_since_their_jobs_were_claimed(senddock_app, database_dsn):
    """Paused or cancelled by someone else while its sends ran: the commit of their results says so,
    so the node's next jobs of that campaign (marked begun already) stay unsent; a campaign still
    sending is not named."""
    paused = make_broadcast(senddock_app, ["a@example.com", "b@example.com"])
    cancelled = make_broadcast(senddock_app, ["c@example.com", "d@example.com"], list_name="other")
    sending = make_broadcast(senddock_app, ["e@example.com", "f@example.com"], list_name="third")
    with psycopg.connect(database_dsn, autocommit=True) as conn:
        node = register(conn, "solo")
        jobs = JobQueue(conn, node).claim(6, begun=True)
        senddock_app.pause_campaign(paused)
        senddock_app.cancel_campaign(cancelled)
        committed = JobQueue(conn, node).commit_group([ResultRow(job, 1, None, SENT) for job in jobs])
    assert committed.stopped == {paused, cancelled}
    assert all(r.recorded for r in committed.recorded.values())
    assert sending not in committed.stopped


def test_a_group_commit_marks_the_deck_begun_only_under_each_jobs_own_claim(senddock_app, database_dsn):
    """Jobs claimed ahead are marked begun in the commit that frees their slots: each only under its
    own claim token (not another token this node holds), only while it is still this node's, and
    not when a result of the same group paused its campaign."""
    make_broadcast(senddock_app, ["p1@example.com", "p2@example.com"], list_name="paused")
    with psycopg.connect(database_dsn, autocommit=True) as conn:
        node = register(conn, "deck")
        queue = JobQueue(conn, node)
        [sending] = queue.claim(1, begun=True)
        [same_campaign] = queue.claim(1, begun=False)
        make_broadcast(senddock_app, ["a1@example.com", "a2@example.com", "a3@example.com"], list_name="deck")
        own, taken, other_token = queue.claim(3, begun=False)
        conn.execute("UPDATE broadcast_jobs SET claim_token = %s WHERE id = %s", (uuid.uuid4(), taken.id))
        committed = queue.commit_group(
            [ResultRow(sending, 0, None, PAUSE, pause_reason="auth_failed")],
            begin=[own, taken, replace(other_token, claim_token=same_campaign.claim_token), same_campaign])
        marked = {row[0] for row in conn.execute("SELECT id FROM broadcast_jobs WHERE send_begun")}
    assert committed.begun == {own.id} == marked


def test_each_sender_has_its_next_job_marked_and_no_more_than_that(make_config, smtp_sink, database_dsn,
                                                                   monkeypatch):
    """Without pacing limits a node keeps RUNWAY jobs begun per sender: at most `concurrency` sends at
    the relay at once, while the jobs marked begun and not recorded (what a kill -9 may leave in
    doubt) reach more than `concurrency` (the next jobs, marked while the sends run) and never more
    than RUNWAY x `concurrency`."""
    concurrency = 3
    smtp_sink.handler.delay = 0.05
    at_relay, peak_at_relay = 0, 0
    lock = threading.Lock()
    handle_data = type(smtp_sink.handler).handle_DATA

    async def counted(self, server, session, envelope):
        nonlocal at_relay, peak_at_relay
        with lock:
            at_relay += 1
            peak_at_relay = max(peak_at_relay, at_relay)
        try:
            return await handle_data(self, server, session, envelope)
        finally:
            with lock:
                at_relay -= 1

    monkeypatch.setattr(type(smtp_sink.handler), "handle_DATA", counted)
    config = make_config(fast_settings(smtp_sink.port, concurrency=concurrency))
    app = Senddock(config)
    make_broadcast(app, [f"user{i}@example.com" for i in range(150)])
    marked: list[int] = []
    done = threading.Event()

    def sample() -> None:
        with psycopg.connect(database_dsn, autocommit=True) as conn:
            while not done.is_set():
                marked.append(conn.execute("SELECT count(*) FROM broadcast_jobs "
                                           "WHERE status = 'sending' AND send_begun").fetchone()[0])
                time.sleep(0.005)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        drain(config, timeout=60)
    finally:
        done.set()
        sampler.join()
    assert len(smtp_sink.received) == 150
    assert 0 < peak_at_relay <= concurrency, peak_at_relay
    assert max(marked) <= RUNWAY * concurrency, max(marked)
    assert max(marked) > concurrency, f"never more jobs marked than senders: {Counter(marked)}"
    app.close()


def test_a_node_uses_at_most_pool_size_connections_whatever_its_concurrency(make_config, smtp_sink):
    """100 sends in flight against a relay that takes 20 ms a message, on pool_size 6: the node's
    sessions on the server (lifeline included) never exceed 6, and everyone gets one message."""
    smtp_sink.handler.delay = 0.02
    settings = fast_settings(smtp_sink.port, concurrency=100, database={"pool_size": 6})
    app = Senddock(make_config(settings))
    emails = [f"user{i}@example.com" for i in range(1500)]
    campaign_id = make_broadcast(app, emails)
    database = app.db.connection
    peak, done = Counter(), threading.Event()

    def sample() -> None:
        with database() as conn:
            while not done.is_set():
                rows = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                                    "AND (application_name LIKE 'senddock-run%%' "
                                    "OR application_name LIKE 'senddock-lifeline%%')").fetchone()
                peak["sessions"] = max(peak["sessions"], rows[0])
                time.sleep(0.01)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        drain(app.config)
    finally:
        done.set()
        sampler.join()
    assert Counter(r.recipients[0] for r in smtp_sink.received) == Counter(emails)
    assert app.campaign_status(campaign_id).status == "finished"
    assert 3 <= peak["sessions"] <= 6, peak
    app.close()


@pytest.mark.parametrize("concurrency", [200, 24])
def test_kill_9_with_many_sends_in_flight_loses_nothing_and_lists_every_duplicate(
        make_config, database_dsn, smtp_sink, tmp_path: Path, concurrency: int):
    """Killed while 200 (or 24) sends are in flight to a relay that takes 50 ms a message: nobody is
    dropped, every duplicate is listed in doubt, and each kill leaves at most its slots, RUNWAY x
    `concurrency`, jobs in doubt (begun and not recorded: the sends, their results waiting for the
    completer and the next jobs marked for the senders). The jobs the node had claimed ahead (its
    deck, never begun) go back as they were: none of them is recorded in doubt for that kill. At
    concurrency 24 the node refills slots from its deck, so jobs are on the deck at the kills; at
    200 its result groups are large enough that claims refill them (see completer.LINGER), and a
    deck is not required."""
    smtp_sink.handler.delay = 0.05
    settings = fast_settings(smtp_sink.port, concurrency=concurrency,
                             recovery={"heartbeat": "200ms", "lease": "3s", "max_rescues": 50})
    app = Senddock(make_config(settings))
    emails = [f"user{i}@example.com" for i in range(4000)]
    campaign_id = make_broadcast(app, emails)
    config_path = write_config(tmp_path, settings)
    in_doubt_after: list[int] = []
    on_deck_at: list[tuple[object, set[int]]] = []  # (the database's time after a kill, jobs claimed ahead)

    def count_in_doubt() -> None:
        # Autocommit: pg_stat_activity is a snapshot per transaction, and one transaction would
        # read the same sessions at every poll.
        with psycopg.connect(database_dsn, autocommit=True) as conn:
            # A statement the dead node sent just before the kill still runs to its end on the
            # server (a group commit marking deck jobs begun commits although no sender got them):
            # look once the node's sessions are gone, so the deck read here is the one recovery finds.
            deadline = time.monotonic() + 30
            while conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                               "AND application_name LIKE 'senddock-%%'").fetchone()[0]:
                assert time.monotonic() < deadline, "the killed node's sessions never went away"
                time.sleep(0.02)
            # What the next incarnation will find in doubt: begun and not recorded.
            in_doubt_after.append(conn.execute(
                "SELECT count(*) FROM broadcast_jobs WHERE status = 'sending' AND send_begun").fetchone()[0])
            now, ahead = conn.execute("SELECT now(), coalesce(array_agg(id), '{}') FROM broadcast_jobs "
                                      "WHERE status = 'sending' AND NOT send_begun").fetchone()
            on_deck_at.append((now, set(ahead)))

    kills = kill_while_sending(config_path, database_dsn, "crowded", rounds=3, progress=300, most_pause=0.3,
                               seed=20261203, after_each=count_in_doubt)
    assert kills >= 2, "the broadcast finished before it could be killed; make it bigger"
    final = start_node(config_path, database_dsn, "crowded", "--exit-when-idle")
    _, stderr = final.communicate(timeout=180)
    assert final.returncode == 0, stderr.decode()[-2000:]

    status = app.campaign_status(campaign_id)
    assert (status.status, status.sent, status.failed) == ("finished", len(emails), 0)
    twice, in_doubt = duplicates_and_in_doubt(app, smtp_sink, emails)
    assert twice <= in_doubt, f"duplicates not recorded as in doubt: {sorted(twice - in_doubt)[:5]}"
    assert all(n <= RUNWAY * concurrency for n in in_doubt_after), in_doubt_after
    assert len(in_doubt) <= kills * RUNWAY * concurrency
    if RUNWAY * concurrency < LINGER_IN_FLIGHT:
        assert any(ahead for _, ahead in on_deck_at), "no job was on the deck at a kill: the test proves nothing"
    with psycopg.connect(database_dsn) as conn:
        doubted = conn.execute("SELECT job_id, started_at FROM delivery_attempts WHERE outcome = 'in_doubt'").fetchall()
    # An in-doubt row of a kill carries the dead claim's time: after the kill before it (that
    # incarnation started later), before this one. A job on the deck at a kill may be in doubt for
    # another kill: an earlier one (recovered, then claimed ahead again: retries are claimed first)
    # or a later one (sent meanwhile, and in flight again).
    previous_kill = None
    for killed_at, ahead in on_deck_at:
        wrongly = [job_id for job_id, started_at in doubted if job_id in ahead and started_at < killed_at
                   and (previous_kill is None or started_at > previous_kill)]
        assert not wrongly, f"jobs never begun recorded in doubt: {wrongly[:5]}"
        previous_kill = killed_at
    print(f"kills={kills} in doubt after each={in_doubt_after} on the deck={[len(a) for _, a in on_deck_at]} "
          f"in_doubt={len(in_doubt)} twice={len(twice)}")
    app.close()


def test_run_refuses_a_pool_too_small_for_its_parts(make_config):
    from senddock.core.runner import Runner
    from senddock.errors import ConfigError

    with pytest.raises(ConfigError) as refused:
        Runner(make_config(fast_settings(database={"pool_size": 3})))
    [line] = refused.value.errors
    assert line.endswith("::$.database.pool_size: 3 is too few connections for `senddock run`: it needs at "
                         "least 4 (the lifeline, the claimer, the completer, the chores), whatever its concurrency")
