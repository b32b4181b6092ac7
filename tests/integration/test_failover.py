"""What a node that lives through a loss of WAL does before anyone claims again (senddock.core.journal).

The real thing, an asynchronous standby promoted mid-broadcast under two live nodes, is the chaos
suite's `failover` scenario (tests/integration/test_chaos.py). Here each step on its own: the
server's epoch is made to change as a promotion changes it (the UNLOGGED marker emptied), and the
database is put in the states a promoted standby can show (a claim gone, a begin mark gone).
"""

from __future__ import annotations

import uuid
from datetime import datetime, timezone

import psycopg
from tests_support import make_broadcast, register

from senddock.core.epoch import ensure_epoch
from senddock.store.jobs import JobResult, JobQueue, ResultRow
from senddock.testing import migrate_database

SENT = JobResult(status="sent", outcome="sent", counts=True, ok=True)


def new_epoch(conn: psycopg.Connection) -> uuid.UUID:
    """What a promotion (or crash recovery) does to the UNLOGGED marker, then the first connection."""
    conn.execute("DELETE FROM server_epoch")
    return ensure_epoch(conn).id


def claim_lost(conn: psycopg.Connection, email: str) -> None:
    """The job as a standby shows it that never got its claim: pending, nobody's."""
    conn.execute("UPDATE broadcast_jobs SET status = 'pending', claimed_by = NULL, claim_token = NULL, "
                 "send_begun = NULL, claimed_at = NULL WHERE email = %s", (email,))


def sent_since(conn: psycopg.Connection, email: str) -> None:
    conn.execute("UPDATE broadcast_jobs SET status = 'sent', claimed_by = NULL, claim_token = NULL "
                 "WHERE email = %s", (email,))


def taken_by(conn: psycopg.Connection, node, email: str) -> None:
    """Claimed by ``node`` since, under a claim of its own."""
    conn.execute("UPDATE broadcast_jobs SET claimed_by = %s, claim_token = %s WHERE email = %s",
                 (node.id, uuid.uuid4(), email))


def states(conn: psycopg.Connection) -> dict[str, tuple]:
    return {r[0]: r[1:] for r in conn.execute("SELECT email, status, send_begun FROM broadcast_jobs")}


def test_no_claim_while_a_live_node_has_not_settled_in_the_new_epoch(senddock_app, database_dsn):
    make_broadcast(senddock_app, ["a@example.com", "b@example.com"])
    with psycopg.connect(database_dsn, autocommit=True) as conn:
        live, claimer = register(conn, "live"), register(conn, "claimer")
        register(conn, "gone", heartbeat_age="1 hour")  # dead before the failover: never waited for
        conn.execute("INSERT INTO nodes (id, name, host, pid) VALUES (%s, 'older', 'h', 1)", (uuid.uuid4(),))
        epoch = new_epoch(conn)
        queue = JobQueue(conn, claimer, lease=30)
        assert queue.claim(5) == []
        assert {name for name, *_ in queue.unsettled_nodes()} == {"live", "claimer"}
        assert queue.settled(epoch)
        assert queue.claim(5) == []  # `live` still has to settle
        assert JobQueue(conn, live).settled(epoch)
        assert len(queue.claim(5)) == 2
        # A node of an earlier senddock (no settled epoch) and one dead for an hour were never waited for.


def test_a_node_past_its_lease_is_no_longer_waited_for(senddock_app, database_dsn):
    make_broadcast(senddock_app, ["a@example.com"])
    with psycopg.connect(database_dsn, autocommit=True) as conn:
        dying, claimer = register(conn, "dying"), register(conn, "claimer")
        epoch = new_epoch(conn)
        queue = JobQueue(conn, claimer, lease=2)
        assert queue.settled(epoch)
        assert queue.claim(5) == []
        conn.execute("UPDATE nodes SET heartbeat_at = now() - interval '3 seconds' WHERE id = %s", (dying.id,))
        assert len(queue.claim(5)) == 1


def test_settling_is_refused_for_an_epoch_that_is_no_longer_the_servers(senddock_app, database_dsn):
    with psycopg.connect(database_dsn, autocommit=True) as conn:
        node = register(conn, "n")
        old = new_epoch(conn)
        new_epoch(conn)
        assert not JobQueue(conn, node).settled(old)


def test_jobs_in_flight_are_taken_back_where_the_server_lost_their_claim_or_mark(senddock_app, database_dsn):
    emails = ["lost-claim@example.com", "lost-mark@example.com", "intact@example.com", "taken@example.com",
              "done@example.com"]
    make_broadcast(senddock_app, emails)
    with psycopg.connect(database_dsn, autocommit=True) as conn:
        me, other = register(conn, "me"), register(conn, "other")
        mine = {j.email: j for j in JobQueue(conn, me).claim(5, begun=True)}
        # What a promoted asynchronous standby may show of them:
        claim_lost(conn, "lost-claim@example.com")
        conn.execute("UPDATE broadcast_jobs SET send_begun = false WHERE email = 'lost-mark@example.com'")
        taken_by(conn, other, "taken@example.com")
        sent_since(conn, "done@example.com")
        new_epoch(conn)
        taken = JobQueue(conn, me).reclaim(list(mine.values()))
        assert taken == {mine["lost-claim@example.com"].id, mine["lost-mark@example.com"].id}
        assert states(conn) == {"lost-claim@example.com": ("sending", True), "lost-mark@example.com": ("sending", True),
                                "intact@example.com": ("sending", True), "taken@example.com": ("sending", True),
                                "done@example.com": ("sent", True)}
        owners = dict(conn.execute("SELECT email, claim_token FROM broadcast_jobs WHERE status = 'sending'").fetchall())
        assert owners["lost-claim@example.com"] == mine["lost-claim@example.com"].claim_token
        # Its result now applies under its own claim, as if nothing had been lost.
        recorded = JobQueue(conn, me).record_results([ResultRow(mine["lost-claim@example.com"], 1, None, SENT)])
        assert recorded[mine["lost-claim@example.com"].id].recorded


def test_a_delivery_committed_again_after_its_claim_was_lost_is_in_doubt_only_if_someone_else_had_it(
        senddock_app, database_dsn):
    emails = ["nobodys@example.com", "resent@example.com", "sending@example.com"]
    make_broadcast(senddock_app, emails)
    with psycopg.connect(database_dsn, autocommit=True) as conn:
        me, other = register(conn, "me"), register(conn, "other")
        mine = {j.email: j for j in JobQueue(conn, me).claim(5, begun=True)}
        # The failover lost the claims: one job is pending again, one was sent by someone since,
        # one is being sent by another node now.
        claim_lost(conn, "nobodys@example.com")
        sent_since(conn, "resent@example.com")
        taken_by(conn, other, "sending@example.com")
        now = datetime.now(timezone.utc)
        JobQueue(conn, me).record_results([ResultRow(j, 1, now, SENT) for j in mine.values()], synchronous=True)
        log = {r[0]: r[1:] for r in conn.execute(
            "SELECT j.email, j.status, a.claim_lost, a.in_doubt FROM delivery_attempts a "
            "JOIN broadcast_jobs j ON j.id = a.job_id")}
    assert log == {"nobodys@example.com": ("sent", True, False), "resent@example.com": ("sent", True, True),
                   "sending@example.com": ("sent", True, True)}


def test_a_live_nodes_own_orphans_wait_until_it_has_settled(senddock_app, database_dsn):
    """A result the node is about to commit again must not find its job recovered (and sent again) first."""
    make_broadcast(senddock_app, ["a@example.com"])
    with psycopg.connect(database_dsn, autocommit=True) as conn:
        me = register(conn, "me")
        queue = JobQueue(conn, me)
        queue.claim(5, begun=True)
        conn.execute("UPDATE broadcast_jobs SET claimed_at = now() - interval '1 minute'")
        epoch = new_epoch(conn)
        assert queue.recover(lease=30, in_doubt="retry", max_rescues=5, dead_nodes=False, orphans_of=[]) == []
        assert queue.settled(epoch)
        recovered = queue.recover(lease=30, in_doubt="retry", max_rescues=5, dead_nodes=False, orphans_of=[])
        assert [(r.email, r.in_doubt) for r in recovered] == [("a@example.com", True)]


def test_the_replication_lag_is_read_from_a_real_standby_and_is_none_without_one(database_dsn):
    from senddock.chaos.replica import ReplicatedPair

    with psycopg.connect(database_dsn, autocommit=True) as conn:
        assert JobQueue(conn, register(conn, "alone")).replication_lag() is None
    with ReplicatedPair() as pair:
        migrate_database(pair.dsn())
        with psycopg.connect(pair.dsn(), autocommit=True) as conn:
            lag = JobQueue(conn, register(conn, "primary")).replication_lag()
        assert lag is not None and 0 <= lag < 5
