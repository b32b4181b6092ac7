"""An idle node costs next to nothing whatever the history (issue 35): every statement a node runs
between claims (its chores: recovery, floors, scheduled starts, cancelled leftovers, bounces,
finishing) and its empty claims reach the per-recipient tables by index, never by reading them
whole. Counted by Postgres itself: pg_stat_user_tables.seq_scan of each table, before and after a
node has polled a database holding ended broadcasts of 30,000 recipients.
``SENDDOCK_TEST_EXPLAIN=1`` logs the plan of every statement the node runs to the server's log
(auto_explain), to find the one that reads a table whole.
"""

from __future__ import annotations

import os
import time

import psycopg

from senddock.api import Senddock
from senddock.testing import drain, fast_settings
from tests_support import make_broadcast

HISTORY = 30_000  # recipients per ended broadcast: enough that the planner never prefers a full read
PER_RECIPIENT = ("broadcast_jobs", "delivery_attempts")  # the tables a broadcast's history is in


def ended_broadcast(conn: psycopg.Connection, campaign_id: int, status: str, job_status: str, reason: str | None) -> None:
    """Gives the (enqueued, still empty) broadcast of ``campaign_id`` HISTORY jobs in ``job_status``
    with one attempt each, and ends the campaign as ``status``: what years of sending leave behind."""
    broadcast_id = conn.execute("SELECT broadcast_id FROM campaigns WHERE id = %s", (campaign_id,)).fetchone()[0]
    conn.execute("DELETE FROM broadcast_jobs WHERE broadcast_id = %s", (broadcast_id,))
    conn.execute("""
        INSERT INTO broadcast_jobs (broadcast_id, subscriber_id, email, domain, status, attempts, failure_reason,
                                    sent_at)
        SELECT %(b)s, -n, 'reader' || n || '@example.com', 'example.com', %(s)s, 1, %(r)s,
               CASE WHEN %(s)s = 'sent' THEN now() END
          FROM generate_series(1, %(n)s) n""", {"b": broadcast_id, "s": job_status, "r": reason, "n": HISTORY})
    conn.execute("""
        INSERT INTO delivery_attempts (job_id, broadcast_id, attempt, node, started_at, outcome)
        SELECT id, broadcast_id, 1, 'history', now(), %s FROM broadcast_jobs WHERE broadcast_id = %s""",
                 ("sent" if job_status == "sent" else "failed", broadcast_id))
    conn.execute("UPDATE campaigns SET status = %s, finished_at = now() WHERE id = %s", (status, campaign_id))


def scans(conn: psycopg.Connection) -> dict[str, tuple[int, int]]:
    """(rows read by sequential scans, idx_scan) of each per-recipient table, its partitions'
    (migration 20) summed, as the shared statistics have them. Rows, not scans: a partition's count
    of sequential scans also grows by scans that read no row of it."""
    conn.execute("SELECT pg_stat_clear_snapshot()")
    rows = conn.execute(
        "SELECT p.relname, coalesce(sum(s.seq_tup_read), 0), coalesce(sum(s.idx_scan), 0) "
        "FROM pg_class p JOIN pg_stat_user_tables s "
        "ON s.relid = p.oid OR s.relid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = p.oid) "
        "WHERE p.relname = ANY(%s) AND p.relnamespace = 'public'::regnamespace GROUP BY p.relname",
        (list(PER_RECIPIENT),)).fetchall()
    return {name: (seq, idx) for name, seq, idx in rows}


def test_an_idle_node_never_reads_a_per_recipient_table_whole(make_config, database_dsn):
    app = Senddock(make_config(fast_settings(2525)))
    finished = make_broadcast(app, ["one@example.com"], name="Sent long ago")
    cancelled = make_broadcast(app, ["two@example.com"], name="Cancelled long ago", list_name="other")
    with psycopg.connect(database_dsn, autocommit=True) as conn:
        ended_broadcast(conn, finished, "finished", "sent", None)
        ended_broadcast(conn, cancelled, "cancelled", "failed", "cancelled")
        for table in PER_RECIPIENT:
            conn.execute(f"ANALYZE {table}")
        # This session's own reads above (whole partitions: each holds one broadcast) reach the
        # shared statistics only when it flushes them: now, before the reset, not among the node's.
        conn.execute("SELECT pg_stat_force_next_flush()")
        conn.execute("SELECT 1")
        conn.execute("SELECT pg_stat_reset()")
        if os.environ.get("SENDDOCK_TEST_EXPLAIN"):  # to find the statement: every plan in the server's log
            for setting in ("session_preload_libraries = 'auto_explain'", "auto_explain.log_min_duration = 0"):
                conn.execute(f"ALTER DATABASE {conn.info.dbname} SET {setting}")
        before = scans(conn)

        # A node starts (its first chores), polls with nothing to claim, and stops: twice, so the
        # statements run enough times for psycopg to prepare them (generic plans included).
        for _ in range(2):
            drain(app.config)
        app.close()
        # Each session's counts reach the shared statistics when it ends: wait until the node's
        # reads by index (there are some: its claims) show, then every full read has shown too.
        deadline = time.monotonic() + 10
        while scans(conn)["broadcast_jobs"][1] == before["broadcast_jobs"][1] and time.monotonic() < deadline:
            time.sleep(0.1)
        assert conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                            "AND pid <> pg_backend_pid()").fetchone()[0] == 0, "a session of the node is left"
        after = scans(conn)
    assert after["broadcast_jobs"][1] > before["broadcast_jobs"][1], "the node's statements were never counted"
    read_whole = {table: after[table][0] - before[table][0] for table in PER_RECIPIENT}
    assert read_whole == dict.fromkeys(PER_RECIPIENT, 0), f"an idle node read these tables whole (times): {read_whole}"
