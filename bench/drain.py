"""Benchmark: how fast `senddock run` drains a broadcast, against a bare SKIP LOCKED loop, in one run.

    python bench/drain.py [--dsn ADMIN_DSN | --embedded] [--jobs 100000] [--workers 5]

Both sides drain the same number of jobs on the same database, through a transport that accepts
every message at once, with the same durability: a claim of ``claim_batch`` jobs committed
(synchronously) before any send, then one commit per job holding its result and its
delivery_attempts row, asynchronous by default as senddock's (``--result-commit sync`` for both). The bare loop
is what a careful engineer would write by hand; senddock adds the per-job start mark (in the same
statement), suppression check at claim, fencing, plugin calls, logging and the finish check.
"""

from __future__ import annotations

import json
import tempfile
import threading
import time
from pathlib import Path

import psycopg
from common import (
    admin_dsn,
    bench_config,
    bench_parser,
    enqueue,
    fill_list,
    machine_cpu,
    open_app,
    reset_jobs,
    scratch_database,
)

from senddock.cli.logs import configure_logging
from senddock.core.runner import Runner

# The same partial index senddock's claim walks for pending jobs (broadcast_id, next_attempt_at, id).
BARE_CLAIM = """
UPDATE broadcast_jobs SET status = 'sending', claim_token = gen_random_uuid(), claimed_at = now()
 WHERE id IN (SELECT id FROM broadcast_jobs
               WHERE broadcast_id = %(broadcast_id)s AND status = 'pending'
               ORDER BY next_attempt_at, id LIMIT %(limit)s FOR UPDATE SKIP LOCKED)
RETURNING id, claim_token
"""
BARE_RESULT = """
WITH done AS (
    UPDATE broadcast_jobs SET status = 'sent', sent_at = now(), attempts = attempts + 1, claim_token = NULL
     WHERE id = %(id)s AND claim_token = %(token)s AND status = 'sending'
    RETURNING id
)
INSERT INTO delivery_attempts (job_id, broadcast_id, attempt, outcome)
SELECT id, %(broadcast_id)s, 1, 'sent' FROM done
RETURNING set_config('synchronous_commit', %(synchronous_commit)s, true)
"""


def bare_loop(dsn: str, broadcast_id: int, workers: int, batch: int, result_commit: str = "async") -> None:
    synchronous_commit = "off" if result_commit == "async" else "on"

    def work() -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            while True:
                claimed = conn.execute(BARE_CLAIM, {"broadcast_id": broadcast_id, "limit": batch}).fetchall()
                if not claimed:
                    return
                for job_id, token in claimed:
                    conn.execute(BARE_RESULT, {"id": job_id, "token": token, "broadcast_id": broadcast_id,
                                               "synchronous_commit": synchronous_commit})

    threads = [threading.Thread(target=work) for _ in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()



def measure(dsn: str, jobs: int, workers: int, batch: int, folder: Path, result_commit: str) -> dict:
    config = bench_config(dsn, folder, {"transport": "instant", "plugins": {"load": ["senddock_bench_plugins"]},
                                        "workers": workers, "claim_batch": batch, "poll_interval": "100ms",
                                        "database": {"result_commit": result_commit}})
    fill_list(dsn, jobs)
    results = {}
    for side in ("bare", "senddock", "bare", "senddock"):  # alternate, keep the best of two
        reset_jobs(dsn)
        app = open_app(config, dsn)
        campaign_id, broadcast_id = enqueue(app)
        started, cpu, machine = time.perf_counter(), time.process_time(), machine_cpu()
        if side == "bare":
            bare_loop(dsn, broadcast_id, workers, batch, result_commit)
        else:
            Runner(config, exit_when_idle=True).run()
        seconds = time.perf_counter() - started
        cpu_us = (time.process_time() - cpu) / jobs * 1e6
        machine_us = (machine_cpu() - machine) / jobs * 1e6
        assert app.campaign_status(campaign_id).sent == jobs
        app.close()
        rate = jobs / seconds
        results[side] = max(results.get(side, 0), rate)
        print(f"  {side:>8}: {jobs:,} jobs in {seconds:.1f}s = {rate:,.0f} jobs/s "
              f"(CPU per job: {cpu_us:.0f} us in this process, {machine_us:.0f} us on the whole machine)", flush=True)
    return {"jobs": jobs, "workers": workers, "claim_batch": batch, "result_commit": result_commit,
            "bare_jobs_per_s": round(results["bare"]), "senddock_jobs_per_s": round(results["senddock"]),
            "ratio": round(results["senddock"] / results["bare"], 2)}


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--workers", type=int, default=5)
    parser.add_argument("--batch", type=int, default=5)
    parser.add_argument("--result-commit", choices=["async", "sync"], default="async",
                        help="database.result_commit for both sides (senddock's default: async)")
    parser.add_argument("--log", choices=["info", "warning"], default="info",
                        help="senddock's log level; info (the default of `senddock run`) writes one JSON line "
                             "per attempt, here to stderr")
    args = parser.parse_args()
    # As `senddock run` does when its stderr is not a terminal: JSON lines.
    configure_logging(args.log, "json")
    with tempfile.TemporaryDirectory() as folder, scratch_database(admin_dsn(args)) as dsn:
        row = measure(dsn, args.jobs, args.workers, args.batch, Path(folder), args.result_commit)
    print(f"senddock {row['senddock_jobs_per_s']:,} jobs/s vs bare loop {row['bare_jobs_per_s']:,} jobs/s: "
          f"ratio {row['ratio']}x")
    print(json.dumps({"benchmark": "drain", **row}))


if __name__ == "__main__":
    main()
