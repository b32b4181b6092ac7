"""Benchmark: a claim costs the same however many jobs of paused campaigns the queue holds.

    python bench/claim_cost.py [--dsn ADMIN_DSN | --embedded] [--paused 1000000] [--small 20000] [--claims 2000]

Two scratch databases on one server, in one run: (a) holds one sending campaign of --small jobs;
(b) holds the same campaign beside a campaign of --paused jobs, enqueued and then paused in SQL.
Two databases rather than one before/after, so the sides can alternate without enqueueing the big
campaign again: each pass times --claims calls of Queue.claim(5) per side, interleaved claim by
claim (a, b, a, b, ...; the second pass b first; the best of the two medians is kept), and marks
each claimed batch sent (untimed) so the next claim finds work, as a worker's results would. The
small campaign's jobs are put back to pending and vacuumed before every pass. Prints the median
claim latency of each side, their ratio (target about 1.0; `--paused 0` makes both sides equal, an
A/A check of the method), and EXPLAIN (ANALYZE, BUFFERS) of one claim on each side (the plans on
stderr, buffer counts and broadcast_jobs index scans in the JSON line): the plan walks only the
sending campaign's part of the claim index, never a paused job (a taller index: a few buffers).
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
    bench_config,
    bench_parser,
    enqueue,
    fill_list,
    open_app,
    scratch_database,
)

from senddock.cli.logs import configure_logging
from senddock.core.nodes import NodeIdentity
from senddock.core.queries import query
from senddock.core.queue import Queue

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
        node = NodeIdentity(id=uuid.uuid4(), name="bench", host="h", pid=1)
        conn.execute("INSERT INTO nodes (id, name, host, pid) VALUES (%s, 'bench', 'h', 1)", (node.id,))
        conn.execute("VACUUM ANALYZE")
    return broadcast_id, node


def reset(conn: psycopg.Connection, broadcast_id: int) -> None:
    # Every measurement starts from the same state: all small jobs pending, dead versions vacuumed.
    conn.execute("UPDATE broadcast_jobs SET status = 'pending', claimed_by = NULL, claimed_at = NULL, "
                 "claim_token = NULL, sent_at = NULL WHERE broadcast_id = %s AND status <> 'pending'", (broadcast_id,))
    conn.execute("VACUUM ANALYZE broadcast_jobs")


def claim_once(conn: psycopg.Connection, queue: Queue, broadcast_id: int) -> float:
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
    queues = {label: Queue(conn, node) for label, (conn, node, _) in sides.items()}
    latencies: dict[str, list[float]] = {label: [] for label in order}
    for _ in range(claims):
        for label in order:
            conn, _, broadcast_id = sides[label]
            latencies[label].append(claim_once(conn, queues[label], broadcast_id))
    return {label: statistics.median(values) for label, values in latencies.items()}


def explain(conn: psycopg.Connection, node: NodeIdentity, broadcast_id: int, label: str) -> dict:
    """One claim under EXPLAIN (ANALYZE, BUFFERS), rolled back: the plan to stderr, a summary of that
    same text back (a second EXPLAIN, in JSON, would be another claim with slightly other counts)."""
    reset(conn, broadcast_id)
    params = {"limit": BATCH, "node_id": node.id, "claim_token": uuid.uuid4()}
    with conn.transaction(force_rollback=True):  # ANALYZE really claims: undo it
        lines = [r[0] for r in conn.execute("EXPLAIN (ANALYZE, BUFFERS) " + query("jobs_claim"), params)]
    print(f"--- EXPLAIN (ANALYZE, BUFFERS) of one claim, {label} ---", *lines, "", sep="\n", file=sys.stderr)
    buffers = [(i, line) for i, line in enumerate(lines) if "Buffers: shared" in line]
    top = buffers[0][1]
    scans = []
    for i, line in enumerate(lines):
        scan = re.search(r"Index (?:Only )?Scan using (\w+) on broadcast_jobs .*rows=(\d+) loops=(\d+)\)", line)
        if scan:
            own = next((b for j, b in buffers if j > i), "")  # the scan's own Buffers line follows it
            scans.append({"index": scan[1], "rows": int(scan[2]), "loops": int(scan[3]),
                          "buffers_hit": _count(own, "hit")})
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
    parser.add_argument("--claims", type=int, default=2_000, help="claims per side in each of the two passes")
    args = parser.parse_args()
    # senddock's own log lines in this process (migrations) go to stderr, never among the results.
    configure_logging("info", "json")
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


if __name__ == "__main__":
    main()
