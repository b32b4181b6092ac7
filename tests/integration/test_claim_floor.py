"""Claims start at each broadcast's floor (migration 4): flat under an old snapshot, never above a pending job.

While a snapshot older than the drain is open, the claim index keeps an entry for every drained
job that cannot be marked dead; a claim walking from the broadcast's first entry steps over all
of them (bench/claim_cost.py --snapshot measures it). Buffer counts of EXPLAIN (ANALYZE, BUFFERS)
are deterministic enough to assert on; wall-clock times are not asserted anywhere.

The floor is only worth having if no job is ever stranded below it: every way a job goes back to
'pending' is exercised after the floor moved past it, and each time the job is claimed again.
"""

from __future__ import annotations

import random
import re
import signal
import uuid
from collections import Counter
from pathlib import Path

import psycopg
import pytest

from senddock.api import Senddock
from senddock.domain import campaigns
from senddock.store.queries import for_broadcasts, query
from senddock.store.jobs import ClaimedJob, JobResult, JobQueue
from senddock.core.runner import Runner
from senddock.testing import fast_settings
from tests_support import make_broadcast, register, sent_count, start_node, wait_for, write_config

SENT = JobResult(status="sent", outcome="sent", counts=True, ok=True)
PAUSE = JobResult(status="pending", outcome="pause", counts=False)  # not the recipient's fault: back as it was
REJECTED = JobResult(status="failed", outcome="fail", counts=True, failure_reason="policy_rejected")


def enqueue_bulk(app: Senddock, conn: psycopg.Connection, list_name: str, size: int) -> int:
    """A list of ``size`` new subscribers (in one statement) and a campaign to it: its id, not sent yet."""
    app.create_list(list_name)
    first = conn.execute("SELECT coalesce(max(id), 0) FROM subscribers").fetchone()[0]
    conn.execute("INSERT INTO subscribers (email) SELECT %s || i || '@example.com' FROM generate_series(1, %s) i",
                 (list_name, size))
    conn.execute("INSERT INTO list_members (list_id, subscriber_id) SELECT l.id, s.id FROM lists l, subscribers s "
                 "WHERE l.name = %s AND s.id > %s", (list_name, first))
    return app.create_campaign(name=list_name, lists=[list_name], subject="x", from_addr="a@example.com",
                               text_body="x")


def plan_of(conn: psycopg.Connection, node_id: uuid.UUID, statement: str = "jobs_claim") -> str:
    """EXPLAIN (ANALYZE, BUFFERS) of one claim (or probe), rolled back."""
    params = {"limit": 5, "node_id": node_id, "claim_token": uuid.uuid4(), "broadcast_id": None,
              "async_results": True, "begun": True, "lease": 30.0}
    with conn.transaction(force_rollback=True):  # ANALYZE really claims: undo it
        sending = tuple(row[0] for row in conn.execute(query("jobs_claim_broadcasts")))
        return "\n".join(r[0] for r in conn.execute("EXPLAIN (ANALYZE, BUFFERS) " + for_broadcasts(statement, sending),
                                                    params))


def buffers(plan: str, node: str | None = None) -> int:
    """Shared buffers (hit or read) of the whole statement, or of the first plan node naming ``node``
    (its own Buffers line is the next one)."""
    text = plan[re.search(node, plan).start():] if node else plan
    found = re.search(r"Buffers: shared hit=(\d+)(?: read=(\d+))?", text)
    return int(found[1]) + int(found[2] or 0)


# The walk over the pending index (index pages and the heap rows its entries point to): what grew
# with every drained job. The whole claim also writes its rows' new versions, and while the old
# snapshot keeps every dead version, finding room for them costs a few more buffers (bounded).
# (A partition's index is named after its columns: broadcast_jobs_pending_idx on broadcast_jobs_bN.)
PENDING_WALK = r"Index Scan using broadcast_jobs_b\d+_broadcast_id_next_attempt_at_id_idx"


def one_poll(runner: Runner) -> None:
    """What every node does once a poll interval (recovery, floors, scheduled starts, finishing)."""
    runner._chores()


def floor_at_start(conn: psycopg.Connection) -> None:
    """The claim as it was before floors: it starts at each broadcast's first entry (the newest
    floor row wins)."""
    conn.execute("INSERT INTO claim_floors (broadcast_id, from_at, from_id) SELECT id, '-infinity', 0 FROM broadcasts")


@pytest.mark.parametrize("holder", ["repeatable_read", "campaign_send"])
def test_a_claim_costs_the_same_after_thousands_of_drained_jobs_while_an_old_snapshot_is_open(
        senddock_app, database_dsn, holder):
    drained_target = 5000
    with psycopg.connect(database_dsn, autocommit=True) as conn, \
            psycopg.connect(database_dsn) as old:  # the long transaction (not autocommit)
        campaign_id = enqueue_bulk(senddock_app, conn, "big", drained_target + 500)
        senddock_app.send_campaign(campaign_id)
        next_campaign = enqueue_bulk(senddock_app, conn, "next", 2000)
        conn.execute("VACUUM ANALYZE broadcast_jobs")
        node = register(conn, "drainer")
        queue = JobQueue(conn, node)
        runner = Runner(senddock_app.config, concurrency=1)
        try:
            if holder == "repeatable_read":  # a report, a pg_dump...
                old.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
                old.execute("SELECT count(*) FROM broadcast_jobs")
            else:  # `campaign send` of the next big campaign: one INSERT ... SELECT, not committed yet
                old.execute("SELECT 1")
                campaigns.send_campaign(old, next_campaign)  # a savepoint inside the open transaction
            one_poll(runner)
            before = plan_of(conn, node.id)
            idle_before = buffers(plan_of(conn, node.id, "due_work_exists"))
            drained = 0
            while drained < drained_target:
                jobs = queue.claim(100)
                # What the workers' results do to each job (untimed here, and cheaper than one commit each).
                conn.execute("UPDATE broadcast_jobs SET status = 'sent', sent_at = now(), claimed_by = NULL, "
                             "claim_token = NULL WHERE id = ANY(%s)", ([j.id for j in jobs],))
                drained += len(jobs)
            one_poll(runner)
            after = plan_of(conn, node.id)
            idle_after = buffers(plan_of(conn, node.id, "due_work_exists"))
            # The control: from the broadcast's first entry, the same claim steps over every drained
            # job's entry. Without it this test could pass because the snapshot was not really held.
            floor_at_start(conn)
            unfloored = plan_of(conn, node.id)
        finally:
            runner.db.close()
            old.rollback()
    walks = [buffers(plan, PENDING_WALK) for plan in (before, after, unfloored)]
    totals = [buffers(plan) for plan in (before, after, unfloored)]
    assert walks[2] > walks[0] + 100, (walks, totals)
    assert walks[1] <= walks[0] + 2, (walks, totals)
    assert totals[1] <= totals[0] + 25 < totals[2], (walks, totals)
    assert idle_after <= idle_before + 5, (idle_before, idle_after)


def unstrandable(conn: psycopg.Connection) -> None:
    """The floor's invariant: no pending job below the start of its broadcast's claims."""
    below = conn.execute(
        "SELECT j.id FROM broadcast_jobs j JOIN broadcast_claim_starts s ON s.broadcast_id = j.broadcast_id "
        "WHERE j.status = 'pending' AND (j.next_attempt_at, j.id) < (s.from_at, s.from_id)").fetchall()
    assert below == [], f"pending jobs below the claim start: {below}"


def floor_id(conn: psycopg.Connection) -> int:
    """The floor of the test's one broadcast (its put-backs aside)."""
    return conn.execute("SELECT from_id FROM claim_floors ORDER BY id DESC LIMIT 1").fetchone()[0]


def ids(jobs: list[ClaimedJob]) -> list[int]:
    return sorted(j.id for j in jobs)


def test_no_put_back_is_ever_stranded_below_the_floor(senddock_app, database_dsn):
    campaign_id = make_broadcast(senddock_app, [f"user{i:02d}@example.com" for i in range(40)])
    with psycopg.connect(database_dsn, autocommit=True) as conn_a, \
            psycopg.connect(database_dsn, autocommit=True) as conn_b, \
            psycopg.connect(database_dsn) as other:  # transactions left open on purpose
        a, b = JobQueue(conn_a, register(conn_a, "a")), JobQueue(conn_b, register(conn_b, "b"))

        def raised_past(jobs: list[ClaimedJob]) -> None:
            b.raise_claim_floors()
            assert floor_id(conn_b) > max(j.id for j in jobs), "the floor did not move past the jobs"

        def claimed_again(jobs: list[ClaimedJob]) -> None:
            unstrandable(conn_b)
            assert b.due_work_exists()
            assert senddock_app.campaign_status(campaign_id).status == "sending"
            b.raise_claim_floors()  # a poll in between changes nothing
            unstrandable(conn_b)
            again = b.claim(len(jobs))
            assert ids(again) == ids(jobs)
            for job in again:
                b.record(job, job.attempts + 1, None, SENT)

        # Released unstarted (a shutdown, a pause seen by the worker, a lost claim).
        jobs = a.claim(3)
        raised_past(jobs)
        assert a.release(jobs) == 3
        claimed_again(jobs)

        # Released by claim token (the claim's reply never came).
        jobs = a.claim(3)
        raised_past(jobs)
        assert a.release_claim(jobs[0].claim_token) == 3
        claimed_again(jobs)

        # A claim that rolls back: its jobs are still 'pending' to the poll, which raises the floor
        # no further than them, although another node claimed and committed the next ones meanwhile.
        other.execute("SELECT 1")
        rolled_back = JobQueue(other, a.node).claim(3)
        ahead = b.claim(3)
        b.raise_claim_floors()
        assert floor_id(conn_b) == min(j.id for j in rolled_back)
        other.rollback()
        for job in ahead:
            b.record(job, 1, None, SENT)
        claimed_again(rolled_back)

        # A pause outcome puts its job back as it was; the worker then puts back the rest.
        first, *rest = jobs = a.claim(3)
        raised_past(jobs)
        assert a.record(first, first.attempts, None, PAUSE).recorded
        assert a.release(rest) == 2
        claimed_again(jobs)

        # Recovered from a dead node: the batch's first job is in doubt (retried), the others were
        # never started and go back to 'pending'.
        gone = register(conn_a, "gone")
        jobs = JobQueue(conn_a, gone).claim(3)
        raised_past(jobs)
        conn_a.execute("UPDATE nodes SET heartbeat_at = now() - interval '1 hour' WHERE id = %s", (gone.id,))
        recovered = b.recover(lease=30, in_doubt="retry", max_rescues=5)
        assert sorted((r.id, r.status) for r in recovered) == [
            (jobs[0].id, "retry"), (jobs[1].id, "pending"), (jobs[2].id, "pending")]
        claimed_again(jobs)

        # A put-back that commits while a poll raises the floor: the poll's snapshot sees the job
        # 'sending' and raises past it, and must neither wait for the put-back nor lose it.
        jobs = a.claim(3)
        raised_past(jobs)
        other.execute("SELECT 1")
        assert JobQueue(other, a.node).release(jobs) == 3  # not committed yet
        b.raise_claim_floors()
        assert floor_id(conn_b) > max(j.id for j in jobs)
        other.commit()
        claimed_again(jobs)

        # Requeued after failing: back through the retry index, whatever the floor says.
        jobs = a.claim(3)
        for job in jobs:
            a.record(job, 1, None, REJECTED)
        raised_past(jobs)
        assert senddock_app.requeue_campaign(campaign_id, "policy_rejected") == 3
        again = b.claim(3)  # due retries come first
        assert ids(again) == ids(jobs)
        for job in again:
            b.record(job, job.attempts + 1, None, SENT)

        # Whatever is left is sent, and every job exactly once.
        while batch := b.claim(5):
            for job in batch:
                b.record(job, job.attempts + 1, None, SENT)
        b.finish_campaigns()
        sends = Counter(r[0] for r in conn_b.execute(
            "SELECT job_id FROM delivery_attempts WHERE outcome = 'sent'"))
        b.raise_claim_floors()  # put-backs are consumed, the finished broadcast's too: none stays
        left = conn_b.execute("SELECT count(*) FROM claim_putbacks").fetchone()[0]
    assert senddock_app.campaign_status(campaign_id).status == "finished"
    assert len(sends) == 40 and set(sends.values()) == {1}
    assert left == 0


def test_random_claims_put_backs_and_polls_never_strand_a_job(senddock_app, database_dsn):
    """A seeded random walk over everything that moves a job in or out of 'pending', with the
    floor's invariant checked after every step."""
    rng = random.Random(20261203)
    campaign_id = make_broadcast(senddock_app, [f"user{i:03d}@example.com" for i in range(150)])
    with psycopg.connect(database_dsn, autocommit=True) as conn, psycopg.connect(database_dsn) as tx:
        nodes = [JobQueue(conn, register(conn, name)) for name in ("one", "two")]
        held: list[tuple[JobQueue, list[ClaimedJob]]] = []
        for _ in range(400):
            queue = rng.choice(nodes)
            step = rng.choice(["claim", "claim", "send", "send", "release", "token", "pause", "rollback",
                               "die", "poll", "poll"])
            if step == "claim":
                if batch := queue.claim(rng.randint(1, 5)):
                    held.append((queue, batch))
            elif step == "rollback":
                tx.execute("SELECT 1")
                JobQueue(tx, queue.node).claim(rng.randint(1, 5))
                queue.raise_claim_floors()
                tx.rollback()
            elif step == "poll":
                queue.raise_claim_floors()
            elif step == "die":
                # A node found dead: its unstarted jobs come back (the first of each batch in doubt).
                victim = register(conn, "victim")
                JobQueue(conn, victim).claim(rng.randint(1, 5))
                conn.execute("UPDATE nodes SET heartbeat_at = now() - interval '1 hour' WHERE id = %s", (victim.id,))
                queue.recover(lease=30, in_doubt="retry", max_rescues=50)
            elif held:
                owner, batch = held.pop(rng.randrange(len(held)))
                if step == "send":
                    for job in batch:
                        owner.record(job, job.attempts + 1, None, SENT)
                elif step == "release":
                    owner.release(batch)
                elif step == "token":
                    owner.release_claim(batch[0].claim_token)
                elif step == "pause":
                    owner.record(batch[0], batch[0].attempts, None, PAUSE)
                    owner.release(batch[1:])
            unstrandable(conn)
        for owner, batch in held:
            owner.release(batch)
        unstrandable(conn)
        # Everything left is claimable: pending jobs from the floor, in-doubt ones as due retries.
        while batch := nodes[0].claim(5):
            for job in batch:
                nodes[0].record(job, job.attempts + 1, None, SENT)
        nodes[0].finish_campaigns()
        left = conn.execute("SELECT status, count(*) FROM broadcast_jobs GROUP BY 1").fetchall()
    assert left == [("sent", 150)]
    assert senddock_app.campaign_status(campaign_id).status == "finished"


def test_two_nodes_stopped_and_killed_mid_broadcast_still_send_everyone(make_config, database_dsn, smtp_sink,
                                                                        tmp_path: Path):
    """Real processes with 100 ms polls (the floors move all the time): stops put claimed jobs back,
    kills leave them to recovery; every recipient gets the message, twice only when in doubt."""
    settings = fast_settings(smtp_sink.port, concurrency=3, recovery={"heartbeat": "200ms", "lease": "2s",
                                                                   "max_rescues": 50})
    app = Senddock(make_config(settings))
    emails = [f"user{i}@example.com" for i in range(2500)]
    campaign_id = make_broadcast(app, emails)
    config_path = write_config(tmp_path, settings)

    def started(name: str):
        """A node once it registered (so it has its signal handlers: SIGTERM earlier kills it)."""
        with app.db.connection() as conn:
            before = conn.execute("SELECT count(*) FROM nodes WHERE name = %s", (name,)).fetchone()[0]
        node = start_node(config_path, database_dsn, name)
        with app.db.connection() as conn:
            wait_for(lambda: conn.execute("SELECT count(*) FROM nodes WHERE name = %s",
                                          (name,)).fetchone()[0] > before, 60, f"{name} to register")
        return node

    alpha, beta = started("alpha"), started("beta")
    interrupted = 0
    try:
        for round_ in range(3):
            progress = sent_count(database_dsn) + 150
            wait_for(lambda: sent_count(database_dsn) > progress or app.campaign_status(campaign_id).status
                     == "finished", 60, "progress")
            interrupted += app.campaign_status(campaign_id).status == "sending"
            alpha.send_signal(signal.SIGTERM)  # a clean stop: claimed, unstarted jobs go back
            assert alpha.wait(30) == 0
            alpha = started("alpha")
            if round_ < 2:
                beta.send_signal(signal.SIGKILL)  # recovered at once by beta's next incarnation
                beta.wait(10)
                beta = started("beta")
    finally:
        for node in (alpha, beta):
            node.send_signal(signal.SIGTERM)
            node.wait(30)
    assert interrupted >= 2, "the broadcast finished before the nodes were stopped often enough; make it bigger"
    final = start_node(config_path, database_dsn, "beta", "--exit-when-idle")
    _, stderr = final.communicate(timeout=120)
    assert final.returncode == 0, stderr.decode()[-2000:]

    status = app.campaign_status(campaign_id)
    assert (status.status, status.sent, status.failed) == ("finished", 2500, 0)
    delivered = Counter(r.recipients[0] for r in smtp_sink.received)
    assert set(delivered) == set(emails)
    with app.db.connection() as conn:
        in_doubt = {r[0] for r in conn.execute(
            "SELECT DISTINCT j.email FROM delivery_attempts a JOIN broadcast_jobs j ON j.id = a.job_id "
            "WHERE a.in_doubt")}
    twice = {email for email, n in delivered.items() if n > 1}
    assert twice <= in_doubt, f"duplicates not recorded as in doubt: {sorted(twice - in_doubt)[:5]}"
    app.close()
