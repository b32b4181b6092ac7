"""The claim must not visit jobs of campaigns that are not sending (measured in bench/claim_cost.py),
and the result commit must reach its jobs by index.

A regression here is silent (claims still work, only slower as the table grows), so the plan is
checked: with a paused campaign of 50,000 jobs in the table, one claim touches a few dozen
buffers, not the thousands that walking the paused jobs would take.
"""

from __future__ import annotations

import re
import uuid

import psycopg

from senddock.store.queries import for_broadcasts, query
from tests_support import make_broadcast


def explain_a_claim_of_five(database_dsn: str) -> str:
    """EXPLAIN (ANALYZE, BUFFERS) of a real claim of 5 by a registered node, rolled back."""
    with psycopg.connect(database_dsn, autocommit=True) as conn:
        node = uuid.uuid4()
        conn.execute("INSERT INTO nodes (id, name, host, pid) VALUES (%s, 'plan', 'h', 1)", (node,))
        params = {"limit": 5, "node_id": node, "claim_token": uuid.uuid4(), "async_results": True, "begun": True,
                  "lease": 30.0}
        sending = tuple(row[0] for row in conn.execute(query("jobs_claim_broadcasts")))
        with conn.transaction():
            plan = "\n".join(r[0] for r in conn.execute(
                "EXPLAIN (ANALYZE, BUFFERS) " + for_broadcasts("jobs_claim", sending), params))
            raise psycopg.Rollback
    return plan


def generic_plan_of_the_group_commit(conn: psycopg.Connection) -> str:
    """EXPLAIN of jobs_record_results as Postgres keeps it once psycopg has prepared it (after five
    runs): a generic plan, which cannot see how many results or marks its parameters hold."""
    broadcasts = tuple(row[0] for row in conn.execute("SELECT id FROM broadcasts ORDER BY id"))
    statement = for_broadcasts("jobs_record_results", broadcasts)
    parameters = {"results": ("json", "'[]'"), "count": ("int", "0"), "begin_ids": ("bigint[]", "'{}'"),
                  "begin_tokens": ("uuid[]", "'{}'"), "node": ("text", "'plan'"),
                  "node_id": ("uuid", "gen_random_uuid()"), "sync": ("text", "'on'")}
    for number, name in enumerate(parameters, start=1):
        statement = statement.replace(f"%({name})s", f"${number}")
    assert "%(" not in statement, "a parameter of the statement is missing here"
    types = ", ".join(kind for kind, _ in parameters.values())
    values = ", ".join(value for _, value in parameters.values())
    conn.execute("ANALYZE broadcast_jobs")
    conn.execute(f"PREPARE record_results ({types}) AS {statement}")
    conn.execute("SET plan_cache_mode = force_generic_plan")
    return "\n".join(r[0] for r in conn.execute(f"EXPLAIN EXECUTE record_results({values})"))


def test_a_claim_never_walks_the_jobs_of_a_paused_campaign(senddock_app, database_dsn):
    senddock_app.create_list("big")
    paused_campaign = senddock_app.create_campaign(name="Big", lists=["big"], subject="x",
                                                   from_addr="a@example.com", text_body="x")
    with psycopg.connect(database_dsn, autocommit=True) as conn:
        # A big broadcast enqueued first (its jobs have the lowest ids), then paused: 50,000
        # pending jobs the claim must not touch.
        broadcast = conn.execute("INSERT INTO broadcasts (campaign_id, enqueued) VALUES (%s, 50000) RETURNING id",
                                 (paused_campaign,)).fetchone()[0]
        conn.execute("UPDATE campaigns SET status = 'paused', broadcast_id = %s WHERE id = %s",
                     (broadcast, paused_campaign))
        conn.execute("INSERT INTO broadcast_jobs (broadcast_id, subscriber_id, email, domain) "
                     "SELECT %s, -i, 'big' || i || '@example.com', 'example.com' FROM generate_series(1, 50000) i",
                     (broadcast,))
    make_broadcast(senddock_app, [f"small{i}@example.com" for i in range(50)], list_name="small", name="Small")
    with psycopg.connect(database_dsn, autocommit=True) as conn:
        conn.execute("ANALYZE broadcast_jobs")
    plan = explain_a_claim_of_five(database_dsn)
    top = re.search(r"Buffers: shared hit=(\d+)", plan)
    assert top is not None, plan
    assert int(top.group(1)) < 500, plan


def test_the_results_statement_reaches_jobs_by_index_in_its_generic_plan(senddock_app, database_dsn):
    """psycopg prepares jobs_record_results after five runs and Postgres then keeps a generic plan,
    which cannot see how many results the JSON parameter holds: without the statement's LIMIT it
    counts 100 rows and joins a small broadcast_jobs by a sequential scan (measured: 0.5 ms of a
    1 ms commit at 3,000 jobs, growing with the table)."""
    make_broadcast(senddock_app, [f"user{i}@example.com" for i in range(3000)])
    with psycopg.connect(database_dsn, autocommit=True) as conn:
        plan = generic_plan_of_the_group_commit(conn)
    assert "broadcast_jobs" in plan, plan
    assert not re.search(r"Seq Scan on broadcast_jobs", plan), plan


def test_the_group_commit_reaches_campaigns_by_index_among_thousands(senddock_app, database_dsn):
    """The group commit's begin marks join each marked job to its campaign by broadcast_id: with
    5,000 finished campaigns in the table (a long-lived installation) its generic plan must reach
    them by index, not scan every campaign once per job marked (measured before migration 13:
    34 ms a commit of 100 marks with 600 jobs in flight, against 4.3 ms by index)."""
    make_broadcast(senddock_app, [f"user{i}@example.com" for i in range(300)])
    with psycopg.connect(database_dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO campaigns (name, subject, from_addr, text_body, status) "
                     "SELECT 'old ' || i, 's', 'a@example.com', 'x', 'finished' FROM generate_series(1, 5000) i")
        conn.execute("ANALYZE campaigns")
        plan = generic_plan_of_the_group_commit(conn)
    assert "campaigns" in plan, plan
    assert not re.search(r"Seq Scan on campaigns", plan), plan


def test_a_claim_looks_each_address_up_in_the_suppressions_once(senddock_app, database_dsn):
    make_broadcast(senddock_app, [f"user{i}@example.com" for i in range(20)])
    plan = explain_a_claim_of_five(database_dsn)
    assert re.search(r"Update on broadcast_jobs .*actual time=\S+ rows=5(\.00)? loops=1", plan), plan  # it did claim 5
    # One lookup per claimed job, not one per SET expression that reads whether it was suppressed.
    assert len(re.findall(r" on suppressions ", plan)) == 1, plan
