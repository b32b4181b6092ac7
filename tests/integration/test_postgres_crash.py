"""Postgres crash-restarts that lose the unflushed end of the WAL: no silent duplicates.

With ``database.result_commit: async``, results commit with ``synchronous_commit = off``. A crash of
Postgres (one backend killed with SIGKILL: the postmaster resets every process and replays the
WAL on disk) loses the commits that were not flushed yet. ``pg_postmaster_start_time()`` does not
change in a crash-restart, so it cannot tell; the engine's UNLOGGED epoch marker does.
"""

from __future__ import annotations

import uuid
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

import psycopg

from senddock.core.epoch import ensure_epoch
from senddock.store.node_identity import NodeIdentity
from senddock.store.jobs import JobResult, JobQueue
from senddock.sink import Sink
from senddock.testing import crash_postgres, create_database, fast_settings, migrate_database
from tests_support import campaign_status, make_broadcast, sent_count, start_node, wait_for, write_config


def _slow_wal_writer(dsn: str) -> None:
    """Asynchronous commits stay in memory for up to 10 s: a crash in that window loses them."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET wal_writer_delay = '10s'")
        conn.execute("ALTER SYSTEM SET wal_writer_flush_after = '1GB'")
        conn.execute("SELECT pg_reload_conf()")


def _app(dsn: str, tmp_path: Path, settings: dict):
    from senddock.api import Senddock
    from senddock.loading import load_config
    from senddock.store.db import Database

    config_path = write_config(tmp_path, settings)
    config = load_config(config_path, environ={"SENDDOCK_DATABASE_URL": dsn})
    return Senddock(config, database=Database(config.database, dsn=dsn)), config_path


def test_results_lost_in_a_crash_restart_come_back_in_doubt(own_server, tmp_path: Path):
    dsn = create_database(own_server.get_uri(), "crash_test")
    migrate_database(dsn)
    _slow_wal_writer(own_server.get_uri())
    app, _ = _app(dsn, tmp_path, fast_settings(recovery={"heartbeat": "200ms", "lease": "1s"}))
    make_broadcast(app, [f"user{i}@example.com" for i in range(5)])

    # A node claims five jobs and records the first two as sent (asynchronously committed).
    node = NodeIdentity(uuid.uuid4(), "doomed", "h", 1)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO nodes (id, name, host, pid) VALUES (%s, 'doomed', 'h', 1)", (node.id,))
        queue = JobQueue(conn, node, result_commit="async")
        ensure_epoch(conn)
        batch = queue.claim(5)
        sent = JobResult(status="sent", outcome="sent", counts=True, last_result="250 ok", ok=True)
        for job, next_job in ((batch[0], batch[1]), (batch[1], batch[2])):
            assert queue.record(job, 1, datetime.now(timezone.utc), sent).recorded
    ids = [j.id for j in batch]

    crash_postgres(dsn)  # ... and the node dies with it (nobody settles its batch)

    with psycopg.connect(dsn, autocommit=True) as conn:
        statuses = dict(conn.execute("SELECT id, status FROM broadcast_jobs").fetchall())
        assert statuses[ids[0]] == statuses[ids[1]] == "sending", "the crash lost no WAL: the test proves nothing"
        conn.execute("UPDATE nodes SET heartbeat_at = now() - interval '1 hour' WHERE id = %s", (node.id,))
        rescuer = JobQueue(conn, NodeIdentity(uuid.uuid4(), "rescuer", "h", 2))
        ensure_epoch(conn)
        recovered = {j.id: j for j in rescuer.recover(lease=1, in_doubt="retry", max_rescues=3)}
        attempts = dict(conn.execute(
            "SELECT job_id, in_doubt FROM delivery_attempts WHERE outcome = 'in_doubt'").fetchall())
        after = dict(conn.execute("SELECT id, status FROM broadcast_jobs").fetchall())
    assert set(recovered) == set(ids)
    # Any of the five may have gone out (their results were lost with the WAL): all are in doubt,
    # each with an attempt row that says so, and all are sent again.
    assert all(recovered[i].in_doubt for i in ids), {i: recovered[i].in_doubt for i in ids}
    assert attempts == {i: True for i in ids}
    assert {after[i] for i in ids} == {"retry"}
    app.close()


def test_crash_restarts_under_running_nodes_leave_no_silent_duplicate(own_server, tmp_path: Path):
    dsn = create_database(own_server.get_uri(), "crash_e2e")
    migrate_database(dsn)
    _slow_wal_writer(own_server.get_uri())
    # A relay with some latency and batches of ten: each worker has several results committed
    # asynchronously (and not yet flushed by anyone's synchronous claim) at most moments.
    smtp_sink = Sink("127.0.0.1", 0, delay=0.01).start()
    settings = fast_settings(smtp_sink.port, recovery={"heartbeat": "500ms", "lease": "30s"},
                             retry={"schedule": ["1s"], "max_retries": 20, "jitter": 0},
                             concurrency=2, claim_batch=10, database={"result_commit": "async"})
    app, config_path = _app(dsn, tmp_path, settings)
    emails = [f"user{i}@example.com" for i in range(2000)]
    campaign_id = make_broadcast(app, emails)
    app.close()
    nodes = [start_node(config_path, dsn, name) for name in ("east", "west")]
    try:
        for threshold in (300, 800, 1300):
            wait_for(lambda: sent_count(dsn) > threshold, 90, f"{threshold} sent")
            crash_postgres(dsn)
        wait_for(lambda: campaign_status(dsn, campaign_id) == "finished", 120, "the broadcast to finish after the crashes")
    finally:
        for node in nodes:
            node.terminate()
        smtp_sink.stop()
    logs = ""
    for node in nodes:
        _, stderr = node.communicate(timeout=60)
        assert node.returncode == 0, stderr.decode()[-3000:]
        logs += stderr.decode()
    # The crashes did lose results (each was committed again by the worker that knew it).
    assert "result_committed_again" in logs, "no result was lost in the crashes: the test proves nothing"
    delivered = Counter(r.recipients[0] for r in smtp_sink.received)
    assert set(delivered) == set(emails)
    twice = {email for email, n in delivered.items() if n > 1}
    with psycopg.connect(dsn) as conn:
        in_doubt = {r[0] for r in conn.execute(
            "SELECT DISTINCT j.email FROM delivery_attempts a JOIN broadcast_jobs j ON j.id = a.job_id "
            "WHERE a.in_doubt")}
        unlogged = conn.execute(
            "SELECT count(*) FROM broadcast_jobs j WHERE j.status = 'sent' AND NOT EXISTS "
            "(SELECT 1 FROM delivery_attempts a WHERE a.job_id = j.id)").fetchone()[0]
    assert twice <= in_doubt, f"duplicates without an in-doubt record: {sorted(twice - in_doubt)[:5]}"
    assert unlogged == 0, "a delivery without an attempt row"
    print(f"delivered twice: {len(twice)}, in doubt: {len(in_doubt)}")


def test_results_lost_behind_a_pooler_are_committed_again_when_the_epoch_changes(make_config, smtp_sink):
    """Behind a pooler in transaction mode a worker's connection survives a Postgres crash, so no
    error tells it that its asynchronously committed results may be gone. The lifeline (a direct
    connection) sees the new epoch; the completer then checks its results and commits the lost ones."""
    import uuid as uuid_module

    from senddock.api import Senddock
    from tests_support import running_node, wait_for

    # One claim of five, all sent at once; no later claim commits (the queue is empty), so no
    # synchronous commit has flushed their results: the node holds the claim until one does.
    app = Senddock(make_config(fast_settings(smtp_sink.port, concurrency=5, claim_batch=5,
                                             database={"result_commit": "async"})))
    campaign_id = make_broadcast(app, [f"user{i}@example.com" for i in range(5)])
    with running_node(app.config) as runner:
        wait_for(lambda: app.campaign_status(campaign_id).status == "finished", 30, "the five to be sent")
        wait_for(lambda: len(runner.held_tokens) == 1, 10, "the node to hold its claim")
        [token] = runner.held_tokens
        # What a crash does to results no synchronous commit flushed: gone, jobs back to 'sending'.
        with app.db.connection() as conn:
            conn.execute("DELETE FROM delivery_attempts")
            conn.execute("UPDATE broadcast_jobs SET status = 'sending', attempts = 0, claim_token = %s, "
                         "claimed_by = %s, send_begun = true", (token, runner.node.id))
            conn.execute("UPDATE campaigns SET status = 'sending', finished_at = NULL")
        runner.lifeline.epoch = uuid_module.uuid4()  # the lifeline came back to a new epoch
        runner.wake_workers()
        wait_for(lambda: app.campaign_status(campaign_id).status == "finished", 30, "the results committed again")
    with app.db.connection() as conn:
        outcomes = conn.execute("SELECT outcome, in_doubt FROM delivery_attempts").fetchall()
    assert outcomes == [("sent", False)] * 5  # rebuilt exactly, nothing in doubt...
    assert len(smtp_sink.received) == 5  # ... and nobody got the message twice
    app.close()
