"""Benchmark: a claim costs the same however many jobs of paused campaigns the queue holds, and
however many jobs were drained while an old snapshot is open.

    python bench/claim_cost.py [--dsn ADMIN_DSN | --embedded] [--paused 1000000] [--small 20000] [--claims 2000]
    python bench/claim_cost.py --snapshot [--dsn ADMIN_DSN | --embedded] [--drained 1000000] [--claims 100]
                               [--poll-jobs 1000] [--holder repeatable-read | campaign-send]

Without --snapshot: two scratch databases on one server, in one run: (a) holds one sending campaign
of --small jobs; (b) holds the same campaign beside a campaign of --paused jobs, enqueued and then
paused in SQL. Two databases rather than one before/after, so the sides can alternate without
enqueueing the big campaign again: each pass times --claims calls of JobQueue.claim(5) per side,
interleaved claim by claim (a, b, a, b, ...; the second pass b first; the best of the two medians
is kept), and marks each claimed batch sent (untimed) so the next claim finds work, as a worker's
results would. The small campaign's jobs are put back to pending and vacuumed before every pass.
Prints the median claim latency of each side, their ratio (target about 1.0; `--paused 0` makes
both sides equal, an A/A check of the method), and EXPLAIN (ANALYZE, BUFFERS) of one claim on each
side (the plans on stderr, buffer counts and broadcast_jobs index scans in the JSON line): the plan
walks only the sending campaign's part of the claim index, never a paused job (a taller index: a
few buffers).

With --snapshot: one sending campaign of --drained jobs (plus a few thousand to measure with), and
a transaction opened on another connection before anything is drained and held to the end: a
REPEATABLE READ transaction that has taken its snapshot (`--holder repeatable-read`, a report),
or an uncommitted `campaign send` of another campaign (`--holder campaign-send`). While it is open,
no drained job's entry in the pending index can be marked dead. Claims are timed at 0 drained jobs,
then --drained jobs are drained (in bulk, in SQL: each through 'sending' to 'sent', as workers
would), and claims are timed again. At each point (after a CHECKPOINT, so that the bulk work
before it is not still being flushed), --claims claims per side, one side after the other (not
interleaved: the slow side's disk reads would evict the fast side's pages), each marked sent
(untimed):
  before: the claim as it was before claim floors, i.e. starting at the broadcast's first entry
          (the same query with the floor set to the start, untimed, before each of these claims);
  after:  the claim from the floor, raised (untimed) whenever --poll-jobs jobs were drained since
          the last raise, as every node's poll does once a poll interval (1,000: one second at
          1,000 jobs/s), so it includes the walk over what was drained since the last poll.
Prints the median claim latency of each side at 0 and at --drained, the ratios (after: target about
1.0; before: how the old claim grew), the time of the one raise that follows the bulk drain (a
node's poll walks that once; draining normally, each poll walks one interval's worth), the time of
`campaign status` for that broadcast (one statement), and EXPLAIN (ANALYZE, BUFFERS) buffer counts
of one claim per side and point in the JSON line.
"""

from __future__ import annotations

import json
import re
import statistics
import sys
import tempfile
import time
import uuid
from contextlib import ExitStack
from pathlib import Path

import psycopg
from common import (
    admin_dsn,
    bench_node,
    bench_config,
    bench_parser,
    enqueue,
    fill_list,
    open_app,
    scratch_database,
)

from senddock.cli.logs import configure_logging
from senddock.domain import campaigns
from senddock.store.node_identity import NodeIdentity
from senddock.store.queries import for_broadcasts, query
from senddock.store.jobs import JobQueue

BATCH = 5


def add_small_list(dsn: str, size: int) -> None:
    """A second list, 'small', of new subscribers (fill_list empties everything, so it cannot do it)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        list_id = conn.execute("INSERT INTO lists (name) VALUES ('small') RETURNING id").fetchone()[0]
        first = conn.execute("SELECT coalesce(max(id), 0) FROM subscribers").fetchone()[0]
        conn.execute("INSERT INTO subscribers (email, name) SELECT 'small' || i || '@example' || (i %% 50) || '.com', "
                     "'Small ' || i FROM generate_series(1, %s) i", (size,))
        conn.execute("INSERT INTO list_members (list_id, subscriber_id) SELECT %s, id FROM subscribers WHERE id > %s",
                     (list_id, first))


def prepare(dsn: str, paused: int, small: int, folder: Path) -> tuple[int, NodeIdentity]:
    """Fill one database; returns the small campaign's broadcast id and a registered node."""
    fill_list(dsn, paused, "big")  # empties every table; with paused=0 an empty list 'big'
    add_small_list(dsn, small)
    config = bench_config(dsn, folder, {"transport": "instant", "plugins": {"load": ["senddock_bench_plugins"]}})
    app = open_app(config, dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        if paused:
            big_campaign, _ = enqueue(app, "big")
            conn.execute("UPDATE campaigns SET status = 'paused', paused_reason = 'bench' WHERE id = %s",
                         (big_campaign,))
        _, broadcast_id = enqueue(app, "small")
        app.close()
        node = bench_node(conn)
    return broadcast_id, node


def reset(conn: psycopg.Connection, broadcast_id: int) -> None:
    # Every measurement starts from the same state: all small jobs pending, dead versions vacuumed.
    # Jobs put back by hand, not by a put-back statement: the claims start at the broadcast's start.
    conn.execute("UPDATE broadcast_jobs SET status = 'pending', claimed_by = NULL, claimed_at = NULL, "
                 "claim_token = NULL, sent_at = NULL WHERE broadcast_id = %s AND status <> 'pending'", (broadcast_id,))
    set_floor(conn, broadcast_id, ("-infinity", 0))
    conn.execute("VACUUM ANALYZE broadcast_jobs")


def set_floor(conn: psycopg.Connection, broadcast_id: int, floor: tuple) -> None:
    """A floor by hand (the newest row is the floor); the one it replaces goes, as a raise does it."""
    conn.execute("WITH replaced AS (DELETE FROM claim_floors WHERE broadcast_id = %(b)s) "
                 "INSERT INTO claim_floors (broadcast_id, from_at, from_id) VALUES (%(b)s, %(at)s, %(id)s)",
                 {"b": broadcast_id, "at": floor[0], "id": floor[1]})


def claim_once(conn: psycopg.Connection, queue: JobQueue, broadcast_id: int) -> float:
    started = time.perf_counter()
    jobs = queue.claim(BATCH)
    seconds = time.perf_counter() - started
    assert len(jobs) == BATCH and all(j.broadcast_id == broadcast_id for j in jobs), "claimed the wrong jobs"
    # Untimed: what the results of a worker would do, so the next claim finds the next jobs.
    conn.execute("UPDATE broadcast_jobs SET status = 'sent', sent_at = now(), claimed_by = NULL, "
                 "claim_token = NULL WHERE id = ANY(%s)", ([j.id for j in jobs],))
    return seconds


def time_claims(sides: dict, order: tuple[str, str], claims: int) -> dict[str, float]:
    """Median seconds per claim on each side, the sides interleaved claim by claim in ``order``:
    a noisy machine's load changes over seconds, so it falls on both sides alike."""
    for conn, _, broadcast_id in sides.values():
        reset(conn, broadcast_id)
    queues = {label: JobQueue(conn, node) for label, (conn, node, _) in sides.items()}
    latencies: dict[str, list[float]] = {label: [] for label in order}
    for _ in range(claims):
        for label in order:
            conn, _, broadcast_id = sides[label]
            latencies[label].append(claim_once(conn, queues[label], broadcast_id))
    return {label: statistics.median(values) for label, values in latencies.items()}


def explain(conn: psycopg.Connection, node: NodeIdentity, broadcast_id: int, label: str, *,
            fresh: bool = True) -> dict:
    """One claim under EXPLAIN (ANALYZE, BUFFERS), rolled back: the plan to stderr, a summary of that
    same text back (a second EXPLAIN, in JSON, would be another claim with slightly other counts).
    ``fresh``: from the state every measurement starts from (see reset)."""
    if fresh:
        reset(conn, broadcast_id)
    params = {"limit": BATCH, "node_id": node.id, "claim_token": uuid.uuid4(), "async_results": True, "begun": True,
              "lease": 30.0}
    with conn.transaction(force_rollback=True):  # ANALYZE really claims: undo it
        sending = tuple(row[0] for row in conn.execute(query("jobs_claim_broadcasts")))
        lines = [r[0] for r in conn.execute("EXPLAIN (ANALYZE, BUFFERS) " + for_broadcasts("jobs_claim", sending),
                                            params)]
    print(f"--- EXPLAIN (ANALYZE, BUFFERS) of one claim, {label} ---", *lines, "", sep="\n", file=sys.stderr)
    buffers = [(i, line) for i, line in enumerate(lines) if "Buffers: shared" in line]
    top = buffers[0][1]
    scans = []
    for i, line in enumerate(lines):
        scan = re.search(r"Index (?:Only )?Scan using (\w+) on broadcast_jobs .*rows=(\d+) loops=(\d+)\)", line)
        if scan:
            own = next((b for j, b in buffers if j > i), "")  # the scan's own Buffers line follows it
            scans.append({"index": scan[1], "rows": int(scan[2]), "loops": int(scan[3]),
                          "buffers_hit": _count(own, "hit"), "buffers_read": _count(own, "read")})
    execution = next(line for line in lines if line.startswith("Execution Time"))
    return {"shared_hit": _count(top, "hit"), "shared_read": _count(top, "read"),
            "execution_ms": float(re.search(r"([\d.]+) ms", execution)[1]), "broadcast_jobs_index_scans": scans}


def _count(line: str, what: str) -> int:
    found = re.search(rf"\b{what}=(\d+)", line)
    return int(found[1]) if found else 0


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--paused", type=int, default=1_000_000, help="jobs of the paused campaign in case (b)")
    parser.add_argument("--small", type=int, default=20_000, help="jobs of the sending campaign")
    parser.add_argument("--claims", type=int, help="claims per side in each of the two passes (2,000), "
                        "or with --snapshot per side at each point (100)")
    parser.add_argument("--snapshot", action="store_true", help="claims under an old snapshot, at 0 and --drained")
    parser.add_argument("--drained", type=int, default=1_000_000, help="jobs drained under the old snapshot")
    parser.add_argument("--poll-jobs", type=int, default=1_000, help="jobs drained between two raises of the floor")
    parser.add_argument("--holder", choices=["repeatable-read", "campaign-send"], default="repeatable-read",
                        help="what keeps the old snapshot open")
    args = parser.parse_args()
    # senddock's own log lines in this process (migrations) go to stderr, never among the results.
    configure_logging("info", "json")
    if args.snapshot:
        snapshot_main(args)
        return
    args.claims = args.claims or 2_000
    if args.claims * BATCH > args.small:
        parser.error(f"--small must hold at least --claims x {BATCH} jobs")
    with ExitStack() as stack:
        folder = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        admin = admin_dsn(args)
        dsn_a = stack.enter_context(scratch_database(admin))
        # With --embedded both databases must live on one server: the second goes on the first's.
        dsn_b = stack.enter_context(scratch_database(admin or dsn_a))
        sides = {}
        for label, dsn, paused in (("a", dsn_a, 0), ("b", dsn_b, args.paused)):
            print(f"  preparing ({label}): {args.small:,} sending jobs" +
                  (f" beside {paused:,} paused jobs" if paused else ""), flush=True)
            broadcast_id, node = prepare(dsn, paused, args.small, folder)
            sides[label] = (stack.enter_context(psycopg.connect(dsn, autocommit=True)), node, broadcast_id)
        medians: dict[str, float] = {}
        for order in (("a", "b"), ("b", "a")):  # which side goes first in each pair, then keep the best of two
            result = time_claims(sides, order, args.claims)
            for label, median in result.items():
                medians[label] = min(medians.get(label, float("inf")), median)
            print(f"  {args.claims:,} claims per side, interleaved ({order[0]} first): median claim "
                  f"{result['a'] * 1e3:.3f} ms (a) without the paused campaign, "
                  f"{result['b'] * 1e3:.3f} ms (b) with it: ratio {result['b'] / result['a']:.2f}", flush=True)
        plans = {"a": explain(*sides["a"], "sending campaign only"),
                 "b": explain(*sides["b"], "with the paused campaign")}
    ratio = medians["b"] / medians["a"]
    print(f"claim with {args.paused:,} paused jobs beside: {medians['b'] * 1e3:.3f} ms vs {medians['a'] * 1e3:.3f} ms "
          f"without: ratio {ratio:.2f}x (target ~1.0); one claim hit {plans['b']['shared_hit']} vs "
          f"{plans['a']['shared_hit']} buffers")
    print(json.dumps({"benchmark": "claim_cost", "paused_jobs": args.paused, "sending_jobs": args.small,
                      "claims": args.claims, "batch": BATCH,
                      "median_claim_ms_without_paused": round(medians["a"] * 1e3, 3),
                      "median_claim_ms_with_paused": round(medians["b"] * 1e3, 3),
                      "ratio": round(ratio, 2), "target_ratio": 1.0,
                      "explain_without_paused": plans["a"], "explain_with_paused": plans["b"]}))



# -- --snapshot: claims while an old snapshot is open -------------------------------------------


def drain_in_bulk(conn: psycopg.Connection, node: NodeIdentity, broadcast_id: int, jobs: int) -> float:
    """Drain the next ``jobs`` pending jobs in SQL, each through 'sending' to 'sent' as a worker's claim
    and result would take it (so the 'sending' indexes get their entries too); returns seconds."""
    started = time.perf_counter()
    first = conn.execute("SELECT min(id) FROM broadcast_jobs WHERE broadcast_id = %s AND status = 'pending'",
                         (broadcast_id,)).fetchone()[0]
    chunk = 100_000
    for low in range(first, first + jobs, chunk):
        span = (broadcast_id, low, min(low + chunk, first + jobs) - 1)
        conn.execute("UPDATE broadcast_jobs SET status = 'sending', claimed_by = %s, claim_token = gen_random_uuid(), "
                     "claimed_at = now() WHERE broadcast_id = %s AND id BETWEEN %s AND %s AND status = 'pending'",
                     (node.id, *span))
        conn.execute("UPDATE broadcast_jobs SET status = 'sent', sent_at = now(), attempts = 1, claimed_by = NULL, "
                     "claim_token = NULL WHERE broadcast_id = %s AND id BETWEEN %s AND %s AND status = 'sending'", span)
        print(f"    drained {span[2] - first + 1:,} of {jobs:,}", flush=True)
    return time.perf_counter() - started


def floor_of(conn: psycopg.Connection, broadcast_id: int) -> tuple:
    return conn.execute("SELECT from_at, from_id FROM claim_floors WHERE broadcast_id = %s ORDER BY id DESC LIMIT 1",
                        (broadcast_id,)).fetchone() or ("-infinity", 0)


class SnapshotSides:
    """The two sides at one point: the same claim query from the broadcast's start (before) and from
    its floor, raised every ``poll_jobs`` drained jobs (after)."""

    def __init__(self, conn: psycopg.Connection, node: NodeIdentity, broadcast_id: int, poll_jobs: int) -> None:
        self.conn, self.node, self.broadcast_id, self.poll_jobs = conn, node, broadcast_id, poll_jobs
        self.queue = JobQueue(conn, node)
        self.since_poll = 0

    def poll(self) -> None:
        self.queue.raise_claim_floors()
        self.since_poll = 0

    def before(self) -> float:
        floor = floor_of(self.conn, self.broadcast_id)
        set_floor(self.conn, self.broadcast_id, ("-infinity", 0))
        seconds = claim_once(self.conn, self.queue, self.broadcast_id)
        set_floor(self.conn, self.broadcast_id, floor)  # still right: the claim took the lowest pending jobs
        self.since_poll += BATCH
        return seconds

    def after(self) -> float:
        if self.since_poll >= self.poll_jobs:
            self.poll()
        seconds = claim_once(self.conn, self.queue, self.broadcast_id)
        self.since_poll += BATCH
        return seconds

    def measure(self, claims: int, label: str) -> dict:
        # Both points start alike: the bulk work before them (the enqueue, the drain) flushed by a
        # checkpoint, not competing with the claims' synchronous commits.
        self.conn.execute("CHECKPOINT")
        # One side after the other, not interleaved: past a few hundred thousand drained jobs each
        # claim from the start reads tens of thousands of buffers from disk and would evict what the
        # next claim from the floor needs. The floor side goes first, in a warm cache.
        result = {"after": statistics.median(self.after() for _ in range(claims))}
        result["explain_after"] = explain(self.conn, self.node, self.broadcast_id, f"{label}, from the floor",
                                          fresh=False)
        result["before"] = statistics.median(self.before() for _ in range(claims))
        floor = floor_of(self.conn, self.broadcast_id)
        set_floor(self.conn, self.broadcast_id, ("-infinity", 0))
        result["explain_before"] = explain(self.conn, self.node, self.broadcast_id, f"{label}, from the start",
                                           fresh=False)
        set_floor(self.conn, self.broadcast_id, floor)
        touched = {side: result[f"explain_{side}"]["shared_hit"] + result[f"explain_{side}"]["shared_read"]
                   for side in ("before", "after")}
        print(f"  {label}: median claim {result['before'] * 1e3:.3f} ms from the start (before), "
              f"{result['after'] * 1e3:.3f} ms from the floor (after); one claim touched "
              f"{touched['before']:,} vs {touched['after']:,} buffers (hit or read)", flush=True)
        return result


def hold_snapshot(dsn: str, holder: str, next_campaign: int | None) -> psycopg.Connection:
    """A connection whose open transaction keeps every drain from now on visible to it."""
    conn = psycopg.connect(dsn)  # not autocommit: its transaction stays open until closed
    if holder == "repeatable-read":
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        conn.execute("SELECT count(*) FROM campaigns")  # the snapshot is taken here
    else:
        conn.execute("SELECT 1")
        campaigns.send_campaign(conn, next_campaign)  # its own transaction is a savepoint of the open one
    return conn


def snapshot_main(args) -> None:
    claims = args.claims or 100
    measured = 2 * claims * 2 * BATCH  # two points, two sides
    with ExitStack() as stack:
        folder = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        dsn = stack.enter_context(scratch_database(admin_dsn(args)))
        print(f"  preparing: one sending campaign of {args.drained + measured + 1_000:,} jobs", flush=True)
        fill_list(dsn, args.drained + measured + 1_000, "big")
        add_small_list(dsn, 1_000)  # the next campaign, for --holder campaign-send
        config = bench_config(dsn, folder, {"transport": "instant", "plugins": {"load": ["senddock_bench_plugins"]}})
        app = open_app(config, dsn)
        campaign_id, broadcast_id = enqueue(app, "big")
        next_campaign = app.create_campaign(name="next", lists=["small"], subject="Hi", from_addr="bench@example.com",
                                            text_body="Hello")
        app.close()
        conn = stack.enter_context(psycopg.connect(dsn, autocommit=True))
        node = bench_node(conn)
        old = stack.enter_context(hold_snapshot(dsn, args.holder, next_campaign))
        print(f"  snapshot held open ({args.holder})", flush=True)
        sides = SnapshotSides(conn, node, broadcast_id, args.poll_jobs)
        sides.poll()
        at_zero = sides.measure(claims, "0 drained")
        print(f"  draining {args.drained:,} jobs with the snapshot open", flush=True)
        drain_seconds = drain_in_bulk(conn, node, broadcast_id, args.drained)
        started = time.perf_counter()
        sides.poll()
        raise_seconds = time.perf_counter() - started
        at_drained = sides.measure(claims, f"{args.drained:,} drained")
        started = time.perf_counter()
        campaigns.campaign_status(conn, campaign_id)  # what `status --watch` runs every refresh
        status_seconds = time.perf_counter() - started
        old.rollback()
    after_ratio = at_drained["after"] / at_zero["after"]
    before_ratio = at_drained["before"] / at_zero["before"]
    print(f"claim with a snapshot held open, at 0 and {args.drained:,} drained jobs: "
          f"{at_zero['after'] * 1e3:.3f} -> {at_drained['after'] * 1e3:.3f} ms from the floor, ratio {after_ratio:.2f}x "
          f"(target ~1.0); {at_zero['before'] * 1e3:.3f} -> {at_drained['before'] * 1e3:.3f} ms from the start "
          f"(the claim before floors), ratio {before_ratio:.1f}x; the poll after the bulk drain: "
          f"{raise_seconds * 1e3:.0f} ms; campaign status: {status_seconds * 1e3:.0f} ms")

    def summary(point: dict) -> dict:
        return {"median_claim_ms_before": round(point["before"] * 1e3, 3),
                "median_claim_ms_after": round(point["after"] * 1e3, 3),
                "explain_before": point["explain_before"], "explain_after": point["explain_after"]}

    print(json.dumps({"benchmark": "claim_cost_snapshot", "holder": args.holder, "drained_jobs": args.drained,
                      "claims": claims, "batch": BATCH, "poll_jobs": args.poll_jobs,
                      "at_0": summary(at_zero), f"at_{args.drained}": summary(at_drained),
                      "ratio_after": round(after_ratio, 2), "ratio_before": round(before_ratio, 1),
                      "target_ratio_after": 1.0, "bulk_drain_s": round(drain_seconds, 1),
                      "raise_after_bulk_drain_ms": round(raise_seconds * 1e3, 1),
                      "campaign_status_ms": round(status_seconds * 1e3, 1)}))


if __name__ == "__main__":
    main()
