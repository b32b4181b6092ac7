"""broadcast_jobs and delivery_attempts are partitioned by broadcast (migration 20): an existing
installation's rows move into their broadcasts' partitions, a new broadcast gets its own at
`campaign send` without blocking the nodes, and the send path's statements touch only the
partitions of the broadcasts they name."""

from __future__ import annotations

import re
import uuid

import psycopg
import pytest

from senddock.store import migrations
from senddock.store.queries import for_broadcasts, query
from senddock.testing import create_database, drain, drop_database, fast_settings
from tests_support import make_broadcast

BEFORE = 19  # the last migration before the partitions

# Three broadcasts as an installation of migration 17 holds them: jobs in every status (one failed
# for a reason), an attempt for each job that was tried, and the tallies their triggers kept.
SEED = """
INSERT INTO campaigns (name, subject, from_addr, text_body, status)
SELECT 'c' || i, 's', 'a@example.com', 'x', 'finished' FROM generate_series(1, 3) i;
INSERT INTO broadcasts (campaign_id) SELECT id FROM campaigns ORDER BY id;
UPDATE campaigns c SET broadcast_id = b.id FROM broadcasts b WHERE b.campaign_id = c.id;
INSERT INTO subscribers (email) SELECT 'u' || i || '@example.com' FROM generate_series(1, 40) i;
INSERT INTO broadcast_jobs (broadcast_id, subscriber_id, email, domain, status, attempts, failure_reason)
SELECT b.id, s.id, s.email, 'example.com', (ARRAY['pending', 'sending', 'retry', 'sent', 'failed'])[1 + s.id % 5],
       s.id % 3, CASE WHEN s.id % 5 = 4 THEN 'bounced' END
  FROM broadcasts b CROSS JOIN subscribers s WHERE b.id < 3 AND s.id <= 20 * b.id;
INSERT INTO delivery_attempts (job_id, broadcast_id, attempt, outcome)
SELECT id, broadcast_id, 1, 'sent' FROM broadcast_jobs WHERE status IN ('sent', 'failed', 'retry');
"""
# Every row, whole, as text: equal before and after means nothing was lost or changed.
ROWS = {"jobs": "SELECT count(*), md5(string_agg(j::text, ',' ORDER BY id)) FROM broadcast_jobs j",
        "attempts": "SELECT count(*), md5(string_agg(a::text, ',' ORDER BY id)) FROM delivery_attempts a",
        "tallies": "SELECT subject, key, sum(n) FROM tallies GROUP BY 1, 2 HAVING sum(n) <> 0 ORDER BY 1, 2"}


@pytest.fixture
def unmigrated_dsn(postgres_server_dsn: str):
    name = "senddock_partitions_" + uuid.uuid4().hex[:12]
    dsn = create_database(postgres_server_dsn, name)
    yield dsn
    drop_database(postgres_server_dsn, name)


def migrate_through(conn: psycopg.Connection, version: int) -> None:
    conn.execute("CREATE TABLE senddock_migrations (version integer PRIMARY KEY, name text NOT NULL, "
                 "applied_at timestamptz NOT NULL DEFAULT now())")
    for migration in migrations.known_migrations():
        if migration.version <= version:
            migrations._apply(conn, migration)


def partitions(conn: psycopg.Connection, parent: str) -> dict[str, str]:
    """Partition name -> its bound."""
    return dict(conn.execute(
        "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
        "WHERE i.inhparent = %s::regclass", (parent,)).fetchall())


def test_the_upgrade_moves_every_row_of_existing_broadcasts_into_their_partitions(unmigrated_dsn: str):
    with psycopg.connect(unmigrated_dsn, autocommit=True) as conn:
        migrate_through(conn, BEFORE)
        conn.execute(SEED)
        before = {name: conn.execute(sql).fetchall() for name, sql in ROWS.items()}
        statuses = {s for (s,) in conn.execute("SELECT DISTINCT status FROM broadcast_jobs")}
        assert statuses == {"pending", "sending", "retry", "sent", "failed"}
        last_job = conn.execute("SELECT max(id) FROM broadcast_jobs").fetchone()[0]

        assert [m.version for m in migrations.migrate(conn)] == [20]

        assert {name: conn.execute(sql).fetchall() for name, sql in ROWS.items()} == before
        assert before["jobs"][0][0] == 60 and before["attempts"][0][0] == 36
        # A partition for each broadcast, the one without rows too; every row in its own.
        expected = {f"broadcast_jobs_b{b}": f"FOR VALUES IN ('{b}')" for b in (1, 2, 3)}
        assert partitions(conn, "broadcast_jobs") == expected
        assert partitions(conn, "delivery_attempts") == {
            name.replace("broadcast_jobs", "delivery_attempts"): bound for name, bound in expected.items()}
        assert conn.execute("SELECT count(*) FROM broadcast_jobs WHERE tableoid::regclass::text "
                            "<> 'broadcast_jobs_b' || broadcast_id").fetchone()[0] == 0
        assert conn.execute("SELECT count(*) FROM ONLY broadcast_jobs").fetchone()[0] == 0
        # Ids go on from the old sequence's, and the tallies count new rows again.
        conn.execute("INSERT INTO broadcast_jobs (broadcast_id, subscriber_id, email, domain) "
                     "VALUES (3, 1, 'u1@example.com', 'example.com')")
        assert conn.execute("SELECT max(id) FROM broadcast_jobs").fetchone()[0] == last_job + 1
        assert conn.execute("SELECT sum(n) FROM tallies WHERE subject = 'jobs' AND key[1] = '3'").fetchone()[0] == 1
        # The jobs' storage settings (migration 1) are on each partition.
        assert "fillfactor=70" in conn.execute(
            "SELECT reloptions FROM pg_class WHERE relname = 'broadcast_jobs_b1'").fetchone()[0]


def test_the_upgrade_of_an_empty_database(unmigrated_dsn: str):
    with psycopg.connect(unmigrated_dsn, autocommit=True) as conn:
        migrate_through(conn, BEFORE)
        migrations.migrate(conn)
        assert partitions(conn, "broadcast_jobs") == {}
        assert conn.execute("SELECT relkind FROM pg_class WHERE relname = 'broadcast_jobs'").fetchone()[0] == "p"


def test_a_broadcast_gets_its_partitions_at_send_without_blocking_the_nodes(senddock_app, database_dsn, make_config,
                                                                           smtp_sink):
    campaign = make_broadcast(senddock_app, [f"user{i}@example.com" for i in range(5)], send=False)
    with psycopg.connect(database_dsn, autocommit=True) as conn:
        assert partitions(conn, "broadcast_jobs") == {}
    senddock_app.send_campaign(campaign)
    with psycopg.connect(database_dsn, autocommit=True) as conn:
        broadcast = conn.execute("SELECT broadcast_id FROM campaigns WHERE id = %s", (campaign,)).fetchone()[0]
        assert partitions(conn, "broadcast_jobs") == {f"broadcast_jobs_b{broadcast}": f"FOR VALUES IN ('{broadcast}')"}
        assert list(partitions(conn, "delivery_attempts")) == [f"delivery_attempts_b{broadcast}"]
        assert conn.execute("SELECT count(*) FROM broadcast_jobs_b%s" % int(broadcast)).fetchone()[0] == 5
        # What a new broadcast's partitions lock: SHARE UPDATE EXCLUSIVE on the parents (ATTACH),
        # which no claim or result commit conflicts with, never ACCESS EXCLUSIVE (PARTITION OF).
        other = conn.execute("INSERT INTO campaigns (name, subject, from_addr, text_body) "
                             "VALUES ('x', 's', 'a@example.com', 'x') RETURNING id").fetchone()[0]
        with conn.transaction(force_rollback=True):
            conn.execute("INSERT INTO broadcasts (campaign_id) VALUES (%s)", (other,))
            locks = set(conn.execute(
                "SELECT relation::regclass::text, mode FROM pg_locks WHERE pid = pg_backend_pid() "
                "AND locktype = 'relation' AND relation::regclass::text IN ('broadcast_jobs', 'delivery_attempts')"))
        assert ("broadcast_jobs", "ShareUpdateExclusiveLock") in locks
        assert ("delivery_attempts", "ShareUpdateExclusiveLock") in locks
        assert not {mode for _, mode in locks} & {"AccessExclusiveLock", "ExclusiveLock", "ShareRowExclusiveLock"}
    assert drain(make_config(fast_settings(smtp_sink.port)))["sent"] == 5


def partitions_in(plan: str) -> set[str]:
    return set(re.findall(r"\b(?:broadcast_jobs|delivery_attempts)_b\d+\b", plan))


def test_the_send_paths_statements_touch_only_their_broadcasts_partitions(senddock_app, database_dsn):
    """Three broadcasts, one sending: the claim, the result commit (in the generic plan psycopg's
    prepared statement gets), the begin marks, the release, the reclaim, and the poll's recovery,
    in-flight count, finish check, due-work probe and floor raise are planned over the sending
    broadcast's partitions alone."""
    ended = [make_broadcast(senddock_app, [f"old{n}-{i}@example.com" for i in range(3)], list_name=f"old{n}",
                            name=f"Old {n}") for n in range(2)]
    make_broadcast(senddock_app, [f"user{i}@example.com" for i in range(20)], list_name="news", name="Now")
    with psycopg.connect(database_dsn, autocommit=True) as conn:
        conn.execute("UPDATE campaigns SET status = 'finished' WHERE id = ANY(%s)", (ended,))
        sending = tuple(row[0] for row in conn.execute(query("jobs_claim_broadcasts")))
        assert len(sending) == 1 and len(partitions(conn, "broadcast_jobs")) == 3
        mine = {f"broadcast_jobs_b{sending[0]}", f"delivery_attempts_b{sending[0]}"}
        node = uuid.uuid4()
        conn.execute("INSERT INTO nodes (id, name, host, pid) VALUES (%s, 'plan', 'h', 1)", (node,))
        claim = {"limit": 5, "node_id": node, "claim_token": uuid.uuid4(), "async_results": True, "begun": True,
                 "lease": 30.0}
        ids = {"job_ids": [1, 2], "claim_tokens": [uuid.uuid4()] * 2, "tokens": [uuid.uuid4()] * 2,
               "node_id": node, "async_results": True, "begun_ids": [1], "held_ids": [2],
               "held_due": [None], "claim_token": uuid.uuid4(), "started_ats": [None, None]}
        recover = {"node_id": node, "name": "plan", "lease": 1.0, "in_doubt": "retry", "max_rescues": 3,
                   "lock_class": 1, "dead_nodes": True, "orphans": True, "held_tokens": []}
        assert tuple(row[0] for row in conn.execute(query("jobs_open_broadcasts"))) == sending
        for name, params in (("jobs_claim", claim), ("jobs_begin", ids), ("jobs_release", ids),
                             ("jobs_reclaim", ids), ("jobs_results_recorded", ids), ("jobs_recover", recover),
                             ("jobs_in_flight_by_domain", {}), ("campaigns_finish", {}), ("due_work_exists", {}),
                             ("jobs_release_claim", ids),
                             ("claim_floors_raise", {"broadcast_ids": list(sending)})):
            with conn.transaction(force_rollback=True):
                plan = "\n".join(r[0] for r in conn.execute(
                    "EXPLAIN (ANALYZE) " + for_broadcasts(name, sending), params))
            assert partitions_in(plan) <= mine, (name, plan)
        # The result commit as Postgres keeps it once prepared: a generic plan, pruned all the same.
        statement = for_broadcasts("jobs_record_results", sending)
        parameters = {"results": ("json", "'[]'"), "count": ("int", "0"), "begin_ids": ("bigint[]", "'{}'"),
                      "begin_tokens": ("uuid[]", "'{}'"), "node": ("text", "'plan'"),
                      "node_id": ("uuid", "gen_random_uuid()"), "sync": ("text", "'on'")}
        for number, name in enumerate(parameters, start=1):
            statement = statement.replace(f"%({name})s", f"${number}")
        conn.execute(f"PREPARE record_results ({', '.join(k for k, _ in parameters.values())}) AS {statement}")
        conn.execute("SET plan_cache_mode = force_generic_plan")
        plan = "\n".join(r[0] for r in conn.execute(
            f"EXPLAIN EXECUTE record_results({', '.join(v for _, v in parameters.values())})"))
        # (Its attempts are inserted into the parent: the row finds its partition as it is written.)
        assert partitions_in(plan) == {f"broadcast_jobs_b{sending[0]}"}, plan
