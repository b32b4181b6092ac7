"""Benchmark: a claim costs the same with one broadcast partition as with hundreds (migration 20), and
the same as on the unpartitioned table of migration 17.

    python bench/partition_claim.py [--dsn ADMIN_DSN | --embedded] [--ended 500] [--ended-jobs 20]
                                    [--small 20000] [--claims 1000] [--flat-sql OLD/senddock/store/sql/jobs.sql]

Three scratch databases on one server, in one run, each holding one sending campaign of --small
jobs:
  flat:     the schema before migration 20 (one broadcast_jobs table), beside --ended finished
            broadcasts of --ended-jobs sent jobs each (and an attempt per job);
  one:      the partitioned schema with the sending broadcast only (one partition per table);
  many:     the partitioned schema beside the same --ended finished broadcasts (a partition each).
Each side claims on one connection of its own, as a node does, so psycopg prepares the claim after
its fifth run, as in a node. Each pass times --claims calls of JobQueue.claim(5) per side, interleaved
claim by claim (the second pass in the reverse order; the best of the two medians is kept), and
marks each claimed batch sent (untimed) so the next claim finds work. Prints the median claim
latency of each side and the ratios many/flat and many/one (target: within 1.1).

The flat side claims with this checkout's JobQueue.claim, or with --flat-sql, with the jobs_claim
statement of that file (e.g. the main branch's, from before the partitions) as it was sent then: the
claim of the old code on the old table against the new code on the partitioned one.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
import uuid
from contextlib import ExitStack

import psycopg
from common import admin_dsn, bench_node, bench_parser, fill_list
from psycopg.rows import class_row

from senddock.cli.logs import configure_logging
from senddock.store import migrations
from senddock.store.jobs import ClaimedJob, JobQueue
from senddock.store.queries import _HEADER, without_comments
from senddock.store.node_identity import NodeIdentity
from senddock.testing import create_database, drop_database, migrate_database

BATCH = 5
UNPARTITIONED = 19  # the last migration before the partitions


def migrate_through(dsn: str, version: int) -> None:
    """The schema as migrations up to ``version`` made it (main's layout, for comparison)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE senddock_migrations (version integer PRIMARY KEY, name text NOT NULL, "
                     "applied_at timestamptz NOT NULL DEFAULT now())")
        for migration in migrations.known_migrations():
            if migration.version <= version:
                migrations._apply(conn, migration)


def add_campaigns(dsn: str, broadcasts: int, jobs: int, status: str) -> int:
    """Campaigns with their broadcasts' jobs, in SQL (the app would migrate the flat side to 18):
    finished ones with every job sent and attempted, as history leaves them, or one sending with
    every job pending. Returns the last broadcast's id."""
    job_status = "sent" if status == "finished" else "pending"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO campaigns (name, subject, from_addr, text_body, status, started_at) "
                     "SELECT %s || i, 'Hi', 'bench@example.com', 'Hello', %s, now() "
                     "FROM generate_series(1, %s) i", (status, status, broadcasts))
        conn.execute("INSERT INTO broadcasts (campaign_id, enqueued) SELECT id, %s FROM campaigns "
                     "WHERE broadcast_id IS NULL ORDER BY id", (jobs,))
        last = conn.execute("UPDATE campaigns c SET broadcast_id = b.id FROM broadcasts b "
                            "WHERE b.campaign_id = c.id AND c.broadcast_id IS NULL "
                            "RETURNING b.id").fetchall()
        conn.execute("INSERT INTO broadcast_jobs (broadcast_id, subscriber_id, email, domain, status, attempts, sent_at) "
                     "SELECT b.id, s.id, s.email, split_part(s.email, '@', 2), %s, 0, NULL "
                     "FROM broadcasts b CROSS JOIN (SELECT id, email FROM subscribers ORDER BY id LIMIT %s) s "
                     "WHERE b.id = ANY(%s) ORDER BY b.id, s.id", (job_status, jobs, [row[0] for row in last]))
        if status == "finished":
            conn.execute("INSERT INTO delivery_attempts (job_id, broadcast_id, attempt, started_at, outcome) "
                         "SELECT id, broadcast_id, 1, now(), 'sent' FROM broadcast_jobs")
        return max(row[0] for row in last)


def prepare(dsn: str, ended: int, ended_jobs: int, small: int) -> tuple[int, NodeIdentity]:
    fill_list(dsn, small)
    if ended:
        add_campaigns(dsn, ended, ended_jobs, "finished")
    broadcast_id = add_campaigns(dsn, 1, small, "sending")
    with psycopg.connect(dsn, autocommit=True) as conn:
        node = bench_node(conn)
    return broadcast_id, node


def reset(conn: psycopg.Connection, broadcast_id: int) -> None:
    conn.execute("UPDATE broadcast_jobs SET status = 'pending', claimed_by = NULL, claimed_at = NULL, "
                 "claim_token = NULL, sent_at = NULL WHERE broadcast_id = %s AND status <> 'pending'", (broadcast_id,))
    conn.execute("DELETE FROM claim_floors WHERE broadcast_id = %s", (broadcast_id,))
    conn.execute("VACUUM ANALYZE broadcast_jobs")


class OldClaim:
    """JobQueue.claim as it was: one statement, jobs_claim of an older jobs.sql, unchanged."""

    def __init__(self, conn: psycopg.Connection, node: NodeIdentity, path: str) -> None:
        parts = _HEADER.split(open(path, encoding="utf-8").read())
        self.statement = without_comments(dict(zip(parts[1::2], parts[2::2]))["jobs_claim"]).rstrip(";")
        self.conn, self.node = conn, node

    def claim(self, limit: int) -> list[ClaimedJob]:
        params = {"limit": limit, "node_id": self.node.id, "claim_token": uuid.uuid4(), "async_results": True,
                  "begun": None, "lease": 30.0}
        with self.conn.cursor(row_factory=class_row(ClaimedJob)) as cur:
            return cur.execute(self.statement, params).fetchall()


def claim_once(conn: psycopg.Connection, queue: JobQueue | OldClaim, broadcast_id: int) -> float:
    started = time.perf_counter()
    jobs = queue.claim(BATCH)
    seconds = time.perf_counter() - started
    assert len(jobs) == BATCH and all(j.broadcast_id == broadcast_id for j in jobs), "claimed the wrong jobs"
    conn.execute("UPDATE broadcast_jobs SET status = 'sent', sent_at = now(), claimed_by = NULL, "
                 "claim_token = NULL WHERE broadcast_id = %s AND id = ANY(%s)", (broadcast_id, [j.id for j in jobs]))
    return seconds


def time_claims(sides: dict, order: list[str], claims: int, flat_sql: str | None) -> dict[str, float]:
    for conn, _, broadcast_id in sides.values():
        reset(conn, broadcast_id)
    # One queue per side for the whole pass, as a node's claimer keeps one per connection.
    queues = {label: OldClaim(conn, node, flat_sql) if label == "flat" and flat_sql else JobQueue(conn, node)
              for label, (conn, node, _) in sides.items()}
    latencies: dict[str, list[float]] = {label: [] for label in order}
    for _ in range(claims):
        for label in order:
            conn, _, broadcast_id = sides[label]
            latencies[label].append(claim_once(conn, queues[label], broadcast_id))
    return {label: statistics.median(values) for label, values in latencies.items()}


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--ended", type=int, default=500, help="finished broadcasts beside the sending one")
    parser.add_argument("--ended-jobs", type=int, default=20, help="jobs of each finished broadcast")
    parser.add_argument("--small", type=int, default=20_000, help="jobs of the sending campaign")
    parser.add_argument("--claims", type=int, default=1_000, help="claims per side in each of the two passes")
    parser.add_argument("--flat-sql", help="a jobs.sql whose jobs_claim the flat side runs (the old code)")
    args = parser.parse_args()
    configure_logging("warning", "json")
    if args.claims * BATCH > args.small:
        parser.error(f"--small must hold at least --claims x {BATCH} jobs")
    if args.embedded:
        parser.error("give --dsn: the three databases go on one server")
    admin = admin_dsn(args)
    with ExitStack() as stack:
        sides = {}
        for label, ended, partitioned in (("flat", args.ended, False), ("one", 0, True), ("many", args.ended, True)):
            name = f"senddock_bench_{uuid.uuid4().hex[:8]}"
            dsn = create_database(admin, name)
            stack.callback(drop_database, admin, name)
            if partitioned:
                migrate_database(dsn)
            else:
                migrate_through(dsn, UNPARTITIONED)
            print(f"  preparing ({label}): {args.small:,} sending jobs beside {ended} finished broadcasts "
                  f"({'partitioned' if partitioned else 'one table'})", file=sys.stderr, flush=True)
            broadcast_id, node = prepare(dsn, ended, args.ended_jobs, args.small)
            sides[label] = (stack.enter_context(psycopg.connect(dsn, autocommit=True)), node, broadcast_id)
        medians: dict[str, float] = {}
        for order in (["flat", "one", "many"], ["many", "one", "flat"]):
            result = time_claims(sides, order, args.claims, args.flat_sql)
            for label, median in result.items():
                medians[label] = min(medians.get(label, float("inf")), median)
            print("  " + ", ".join(f"{label} {result[label] * 1e3:.3f} ms" for label in order), file=sys.stderr,
                  flush=True)
    ms = {label: round(value * 1e3, 3) for label, value in medians.items()}
    print(f"median claim: {ms['flat']} ms on one table beside {args.ended} finished broadcasts, {ms['one']} ms "
          f"partitioned with 1 broadcast, {ms['many']} ms partitioned beside {args.ended}: "
          f"many/flat {medians['many'] / medians['flat']:.2f}x, many/one {medians['many'] / medians['one']:.2f}x "
          f"(target within 1.1x)")
    print(json.dumps({"benchmark": "partition_claim", "flat_claim": "--flat-sql" if args.flat_sql else "this checkout's",
                      "ended_broadcasts": args.ended, "ended_jobs": args.ended_jobs,
                      "sending_jobs": args.small, "claims": args.claims, "batch": BATCH,
                      "median_claim_ms": ms, "many_over_flat": round(medians["many"] / medians["flat"], 2),
                      "many_over_one": round(medians["many"] / medians["one"], 2)}))


if __name__ == "__main__":
    main()
