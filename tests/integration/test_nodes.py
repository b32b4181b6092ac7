"""Several nodes on one database: no job claimed by two live nodes, fencing, leases, finishing."""

from __future__ import annotations

import signal
import threading
import time
from collections import Counter
from pathlib import Path

import psycopg
import pytest

from senddock.api import Senddock
from senddock.store.jobs import JobResult, JobQueue
from senddock.core.runner import Runner
from senddock.testing import fast_settings
from tests_support import (jobs_by_email, make_broadcast, register, sent_count, start_node, still_true, wait_for,
                           write_config)


def test_two_nodes_drain_one_broadcast_without_duplicates(make_config, database_dsn, smtp_sink, tmp_path: Path):
    settings = fast_settings(smtp_sink.port, concurrency=3)
    app = Senddock(make_config(settings))
    emails = [f"user{i}@example.com" for i in range(800)]
    campaign_id = make_broadcast(app, emails)
    config_path = write_config(tmp_path, settings)
    nodes = [start_node(config_path, database_dsn, name, "--exit-when-idle") for name in ("alpha", "beta")]
    for node in nodes:
        _, stderr = node.communicate(timeout=120)
        assert node.returncode == 0, stderr.decode()[-2000:]
    assert app.campaign_status(campaign_id).status == "finished"
    assert Counter(r.recipients[0] for r in smtp_sink.received) == Counter(emails)
    with app.db.connection() as conn:
        by_node = dict(conn.execute("SELECT node, count(*) FROM delivery_attempts GROUP BY 1").fetchall())
    assert set(by_node) == {"alpha", "beta"} and sum(by_node.values()) == 800
    app.close()


def test_when_one_of_two_nodes_dies_the_other_takes_its_jobs_after_the_lease(make_config, database_dsn, smtp_sink,
                                                                             tmp_path: Path):
    settings = fast_settings(smtp_sink.port, recovery={"heartbeat": "200ms", "lease": "2s"})
    app = Senddock(make_config(settings))
    # Enough that the survivor still has work when the dead node's lease runs out: it exits once
    # nothing is due (the dead node's jobs are not, until then), and it sends ~1,000 a second.
    emails = [f"user{i}@example.com" for i in range(4000)]
    campaign_id = make_broadcast(app, emails)
    config_path = write_config(tmp_path, settings)
    doomed = start_node(config_path, database_dsn, "doomed")
    wait_for(lambda: sent_count(database_dsn) > 100, 60, "the first node to send")
    survivor = start_node(config_path, database_dsn, "survivor", "--exit-when-idle")
    doomed.send_signal(signal.SIGKILL)
    doomed.wait(10)
    killed_at = time.monotonic()
    _, stderr = survivor.communicate(timeout=120)
    assert survivor.returncode == 0, stderr.decode()[-2000:]
    assert app.campaign_status(campaign_id).status == "finished"
    delivered = Counter(r.recipients[0] for r in smtp_sink.received)
    assert set(delivered) == set(emails)
    with app.db.connection() as conn:
        taken = conn.execute(
            "SELECT count(*), min(finished_at) FROM delivery_attempts WHERE node = 'survivor' AND outcome = 'in_doubt'"
        ).fetchone()
        in_doubt = {r[0] for r in conn.execute(
            "SELECT j.email FROM delivery_attempts a JOIN broadcast_jobs j ON j.id = a.job_id WHERE a.in_doubt")}
    assert taken[0] > 0, "the survivor recovered the dead node's started jobs"
    assert {e for e, n in delivered.items() if n > 1} <= in_doubt
    assert time.monotonic() - killed_at >= 2 or taken[0] > 0
    app.close()


def test_a_fenced_out_worker_cannot_overwrite_the_reassigned_job(senddock_app, database_dsn):
    make_broadcast(senddock_app, ["a@example.com", "b@example.com"])
    sent = JobResult(status="sent", outcome="sent", counts=True, ok=True)
    retry = JobResult(status="retry", outcome="retry", counts=True, delay=60)
    with psycopg.connect(database_dsn, autocommit=True) as conn_a, psycopg.connect(database_dsn, autocommit=True) as conn_b:
        slow = register(conn_a, "slow")
        fast = register(conn_b, "fast")
        queue_a, queue_b = JobQueue(conn_a, slow), JobQueue(conn_b, fast)
        first_a, second_a = queue_a.claim(5)  # the slow node is sending the first; the second waits
        # The slow node's lease runs out while it is still sending (the server kept running).
        conn_a.execute("UPDATE nodes SET heartbeat_at = now() - interval '1 second' WHERE id = %s", (slow.id,))
        recovered = {r.email: (r.status, r.in_doubt) for r in queue_b.recover(lease=0.5, in_doubt="retry", max_rescues=5)}
        # Only the batch's first unfinished job may have been sending: in doubt. The other was never started.
        assert recovered == {"a@example.com": ("retry", True), "b@example.com": ("pending", False)}
        first_b, second_b = queue_b.claim(5)
        assert first_b.id == first_a.id and first_b.claim_token != first_a.claim_token

        # The slow worker's late 'retry' changes nothing: the job is the fast node's now...
        late = queue_a.record(first_a, 1, None, retry)
        assert (late.recorded, late.late_sent) == (False, False)
        assert conn_a.execute("SELECT status, claim_token FROM broadcast_jobs WHERE id = %s",
                              (first_a.id,)).fetchone() == ("sending", first_b.claim_token)

        # But a message the slow worker did deliver is marked sent, so it never goes out again.
        delivered = queue_a.record(first_a, 1, None, sent)
        assert (delivered.recorded, delivered.late_sent) == (False, True)
        assert conn_a.execute("SELECT status FROM broadcast_jobs WHERE id = %s", (first_a.id,)).fetchone() == ("sent",)
        # The fast node's own result for that job is fenced out too.
        outcome = queue_b.record(first_b, 2, None, retry)
        assert (outcome.recorded, outcome.late_sent) == (False, False)
        assert conn_a.execute("SELECT status FROM broadcast_jobs WHERE id = %s", (first_a.id,)).fetchone() == ("sent",)
        log = conn_a.execute("SELECT node, outcome, claim_lost FROM delivery_attempts ORDER BY id").fetchall()
    assert log == [("fast", "in_doubt", False), ("slow", "retry", True), ("slow", "sent", True), ("fast", "retry", True)]


@pytest.mark.parametrize(("wal_lost", "result_commit"), [(True, "async"), (False, "async"), (True, "sync")])
def test_after_the_server_lost_wal_every_job_of_a_dead_node_is_in_doubt(senddock_app, database_dsn, wal_lost,
                                                                      result_commit):
    """Results committed asynchronously may have been lost in the crash: batch order proves nothing.
    Committed synchronously, none can be: batch order holds. (tests/integration/test_postgres_crash.py
    does it with a real crash.)"""
    make_broadcast(senddock_app, ["a@example.com", "b@example.com"])
    with psycopg.connect(database_dsn, autocommit=True) as conn:
        gone = register(conn, "gone")
        JobQueue(conn, gone, result_commit=result_commit).claim(5)
        if wal_lost:
            conn.execute("DELETE FROM server_epoch")  # what crash recovery or a promotion does to it
        conn.execute("UPDATE nodes SET heartbeat_at = now() - interval '1 hour' WHERE id = %s", (gone.id,))
        survivor = register(conn, "survivor")
        recovered = JobQueue(conn, survivor).recover(lease=30, in_doubt="retry", max_rescues=5)
    # Without a loss of WAL, the batch's order holds: only its first job may have been sending.
    assert sorted((r.email, r.in_doubt) for r in recovered) == [
        ("a@example.com", True), ("b@example.com", wal_lost and result_commit == "async")]


def test_a_live_nodes_orphaned_jobs_come_back_with_the_batch_rule(senddock_app, database_dsn):
    """Jobs of this node that no worker holds (a worker gave up on its batch) come back: the
    batch's first unfinished job in doubt, the others as they were."""
    make_broadcast(senddock_app, ["a@example.com", "b@example.com", "c@example.com"])
    with psycopg.connect(database_dsn, autocommit=True) as conn:
        me = register(conn, "me")
        queue = JobQueue(conn, me)
        held = queue.claim(2)
        # Claimed a while ago, but after the server's start (a fresh embedded server may be young).
        uptime = conn.execute("SELECT extract(epoch FROM now() - pg_postmaster_start_time())").fetchone()[0]
        time.sleep(max(0.0, 3 - float(uptime)))
        conn.execute("UPDATE broadcast_jobs SET claimed_at = greatest(now() - interval '1 minute', "
                     "pg_postmaster_start_time() + interval '1 second') WHERE status = 'sending'")
        assert queue.recover(lease=30, in_doubt="retry", max_rescues=5, dead_nodes=False, orphans_of=[held[0].claim_token]) == []  # still held
        orphans = queue.recover(lease=30, in_doubt="retry", max_rescues=5, dead_nodes=False, orphans_of=[])
        assert sorted((r.email, r.status, r.in_doubt) for r in orphans) == [
            ("a@example.com", "retry", True), ("b@example.com", "pending", False)]
        young = queue.claim(5)
        assert queue.recover(lease=30, in_doubt="retry", max_rescues=5, dead_nodes=False, orphans_of=[]) == []  # claimed a moment ago
        assert len(young) == 3


def test_a_live_node_of_the_same_name_keeps_its_jobs(senddock_app, database_dsn):
    """Recovery by name needs proof of death: a held lifeline lock protects a live incarnation."""
    from senddock.store.node_identity import LOCK_CLASS

    make_broadcast(senddock_app, ["a@example.com", "b@example.com"])
    with psycopg.connect(database_dsn, autocommit=True) as lifeline, psycopg.connect(database_dsn, autocommit=True) as other:
        live = register(lifeline, "twin")
        lock_id = lifeline.execute("SELECT lock_id FROM nodes WHERE id = %s", (live.id,)).fetchone()[0]
        assert lifeline.execute("SELECT pg_try_advisory_lock(%s, %s)", (LOCK_CLASS, lock_id)).fetchone()[0]
        JobQueue(lifeline, live).claim(5)
        newcomer = register(other, "twin")
        assert JobQueue(other, newcomer).recover(lease=30, in_doubt="retry", max_rescues=5) == []
        lifeline.execute("SELECT pg_advisory_unlock_all()")  # the incarnation dies: its lock is gone
        recovered = JobQueue(other, newcomer).recover(lease=30, in_doubt="retry", max_rescues=5)
    assert sorted(r.email for r in recovered) == ["a@example.com", "b@example.com"]


def test_two_nodes_finishing_the_last_two_jobs_at_once_finish_the_campaign(senddock_app, database_dsn):
    campaign_id = make_broadcast(senddock_app, ["a@example.com", "b@example.com"])
    barrier = threading.Barrier(2)
    errors = []

    def finish_one(name: str) -> None:
        try:
            with psycopg.connect(database_dsn, autocommit=True) as conn:
                queue = JobQueue(conn, register(conn, name))
                [job] = queue.claim(1)
                barrier.wait()
                queue.record(job, 1, None, JobResult(status="sent", outcome="sent", counts=True, ok=True))
                queue.finish_campaigns(job.broadcast_id)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=finish_one, args=(n,)) for n in ("one", "two")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert senddock_app.campaign_status(campaign_id).status == "finished"


def test_a_node_cut_off_from_its_heartbeat_stops_sending_on_its_own(make_config, smtp_sink):
    settings = fast_settings(smtp_sink.port, recovery={"heartbeat": "200ms", "lease": "1s"}, concurrency=2)
    app = Senddock(make_config(settings))
    make_broadcast(app, [f"user{i}@example.com" for i in range(3000)])
    runner = Runner(app.config)
    thread = threading.Thread(target=runner.run)
    thread.start()
    try:
        wait_for(lambda: len(smtp_sink.received) > 50, 60, "sending to start")
        runner.lifeline.stop()  # heartbeats stop, as when the node is cut off from Postgres
        wait_for(lambda: not runner.lifeline.may_send(), 10, "the node to fence itself")
        wait_for(lambda: runner.slots.in_use == 0, 10, "the sends begun before it to end")
        stalled_at = len(smtp_sink.received)
        # A lease's worth (1 s, five heartbeats): nothing more begins while it stays fenced.
        assert still_true(lambda: len(smtp_sink.received) == stalled_at, 1.0), \
            "a node whose heartbeat is stale must not start sends"
        assert not runner.lifeline.may_send()
    finally:
        runner.request_stop()
        thread.join(30)
    app.close()


@pytest.mark.parametrize(
    ("hook", "expected"),
    [
        ("send_message", ("failed", "plugin_error", 1)),  # captured as a failed send
        ("classify_result", ("sent", None, 1)),  # the built-in classifier stands in
        ("compute_backoff", ("failed", "retries_exhausted", 3)),  # the built-in backoff stands in
    ],
)
def test_a_plugin_whose_hook_raises_fails_jobs_not_workers(make_config, smtp_sink, tmp_path: Path, monkeypatch,
                                                          hook, expected):
    from senddock.sink import FailRule
    from senddock.testing import drain

    plugin = tmp_path / "plugin_site" / f"acme_buggy_{hook}.py"
    plugin.parent.mkdir()
    body = {
        "compute_backoff": "def compute_backoff(attempt):\n    raise KeyError('bug in the plugin')\n",
    }.get(hook, f"def {hook}(message):\n    if message.recipient.email.startswith('boom'):\n"
                "        raise KeyError('bug in the plugin')\n")
    plugin.write_text(f"from senddock import hookimpl\n\n@hookimpl(tryfirst=True)\n{body}", encoding="utf-8")
    monkeypatch.syspath_prepend(str(plugin.parent))
    if hook == "compute_backoff":
        smtp_sink.handler.rules = [FailRule.parse("boom*@*=450 4.2.0 mailbox busy, later")]
    app = Senddock(make_config(fast_settings(smtp_sink.port, plugins={"load": [f"acme_buggy_{hook}"]})))
    campaign_id = make_broadcast(app, ["boom1@example.com", "fine@example.com", "boom2@example.com"])
    drain(app.config)
    jobs = jobs_by_email(app, campaign_id)
    assert jobs["fine@example.com"] == ("sent", None, 1)
    assert jobs["boom1@example.com"] == expected
    assert jobs["boom2@example.com"] == expected
    assert app.campaign_status(campaign_id).status == "finished"
    app.close()


def test_a_worker_started_hook_that_raises_leaves_every_sender_sending(make_config, smtp_sink, tmp_path: Path,
                                                                        monkeypatch):
    """worker_started is optional and best effort: a plugin's that raises in every sender thread
    is logged, and the node sends all the same (the transport opens its connection at the send)."""
    from senddock.testing import drain

    plugin = tmp_path / "plugin_site" / "acme_buggy_start.py"
    plugin.parent.mkdir()
    ran = tmp_path / "worker_started.log"
    plugin.write_text("from senddock import hookimpl\n\n@hookimpl\ndef worker_started(worker_state):\n"
                      f"    with open({str(ran)!r}, 'a') as log:\n        log.write('ran\\n')\n"
                      "    raise KeyError('bug in the plugin')\n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(plugin.parent))
    app = Senddock(make_config(fast_settings(smtp_sink.port, concurrency=3, plugins={"load": ["acme_buggy_start"]})))
    emails = [f"user{i}@example.com" for i in range(6)]
    campaign_id = make_broadcast(app, emails)
    drain(app.config)
    assert ran.read_text(encoding="utf-8").splitlines() == ["ran"] * 3  # once in each of the 3 senders
    assert sorted(r.recipients[0] for r in smtp_sink.received) == sorted(emails)
    assert app.campaign_status(campaign_id).status == "finished"
    app.close()


def test_a_stop_while_senders_are_still_starting_names_them_apart(make_config, smtp_sink, tmp_path: Path,
                                                                     monkeypatch):
    """A node told to stop while its senders are still in worker_started (a transport opening its
    connection to a relay that does not answer) began no send: the shutdown_timeout line names
    those threads as still starting, not as sends cut off."""
    import structlog
    from structlog.testing import capture_logs

    from senddock.core import runner as runner_module
    from tests_support import running_node

    plugin = tmp_path / "plugin_site" / "acme_slow_start.py"
    plugin.parent.mkdir()
    release = tmp_path / "release"
    plugin.write_text("import os, time\nfrom senddock import hookimpl\n\n@hookimpl\ndef worker_started(worker_state):\n"
                      f"    while not os.path.exists({str(release)!r}):\n        time.sleep(0.02)\n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(plugin.parent))
    app = Senddock(make_config(fast_settings(smtp_sink.port, concurrency=2, shutdown_timeout="300ms",
                                             plugins={"load": ["acme_slow_start"]})))
    try:
        # A fresh logger: the runner's may be bound already (logging is cached once configured).
        with capture_logs() as logs, monkeypatch.context() as patch:
            patch.setattr(runner_module, "log", structlog.get_logger(runner_module.__name__))
            with running_node(app.config) as runner:
                deadline = time.monotonic() + 10
                while runner.senders is None or len(runner.senders.still_starting()) < 2:
                    assert time.monotonic() < deadline, "the senders never started"
                    time.sleep(0.02)
                # Released only after the node has stopped (below): its stop gives up on them first.
        [line] = [entry for entry in logs if entry["event"] == "shutdown_timeout"]
        assert line["senders"] == []
        assert line["in_worker_started"] == ["senddock-sender-0", "senddock-sender-1"]
    finally:
        release.touch()  # the stuck threads go on, and find the node stopped
        app.close()


def test_a_stop_puts_back_unsent_the_jobs_still_waiting_for_a_busy_sender(make_config, smtp_sink, database_dsn):
    """Both senders stuck in a send past the shutdown timeout, each with its next job marked begun
    and waiting (the runway): the stop puts those two back as they were, so only the two sends
    that began are left to recovery (in doubt)."""
    from tests_support import running_node

    smtp_sink.handler.delay = 3.0  # each send waits this long for the relay's answer to DATA
    in_data: list[list[str]] = []  # the sends the relay is holding in DATA
    hold = smtp_sink.handler.handle_DATA

    async def counted(server, session, envelope):
        in_data.append(envelope.rcpt_tos)
        return await hold(server, session, envelope)

    smtp_sink.handler.handle_DATA = counted  # read by each new SMTP session: before the node connects
    app = Senddock(make_config(fast_settings(smtp_sink.port, concurrency=2, shutdown_timeout="300ms")))
    make_broadcast(app, [f"user{i}@example.com" for i in range(10)])

    def begun() -> int:
        with psycopg.connect(database_dsn, autocommit=True) as conn:
            return conn.execute("SELECT count(*) FROM broadcast_jobs WHERE status = 'sending' AND send_begun"
                                ).fetchone()[0]

    with running_node(app.config):
        deadline = time.monotonic() + 10
        # Two sends held in DATA, two jobs marked for their senders. Not the marks alone: on a busy
        # machine a sender may not have begun its first send yet, and at the stop that job goes
        # back unsent (rightly: it never began).
        while begun() < 4 or len(in_data) < 2:
            assert time.monotonic() < deadline, f"the senders' next jobs were never marked ({len(in_data)} in DATA)"
            time.sleep(0.02)
    assert begun() == 2
    assert smtp_sink.received == []  # the stuck sends had not been answered yet
    app.close()


def test_due_retries_are_claimed_before_pending_jobs(senddock_app, database_dsn):
    make_broadcast(senddock_app, [f"user{i}@example.com" for i in range(20)])
    with psycopg.connect(database_dsn, autocommit=True) as conn:
        conn.execute("UPDATE broadcast_jobs SET status = 'retry', attempts = 1, next_attempt_at = now() "
                     "WHERE email IN ('user17@example.com', 'user18@example.com')")
        conn.execute("UPDATE broadcast_jobs SET status = 'retry', attempts = 1, next_attempt_at = now() + interval '1 hour' "
                     "WHERE email = 'user19@example.com'")
        queue = JobQueue(conn, register(conn, "orderly"))
        first = queue.claim(3)
        locks = conn.execute("SELECT count(*) FROM broadcast_jobs WHERE status = 'sending'").fetchone()[0]
    # The two due retries first, then the oldest pending job; the retry due in an hour waits.
    assert {j.email for j in first} == {"user17@example.com", "user18@example.com", "user0@example.com"}
    assert locks == 3
