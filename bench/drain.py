"""Benchmark: how fast `senddock run` drains a broadcast, against a bare SKIP LOCKED loop, in one run.

    python bench/drain.py [--dsn ADMIN_DSN | --embedded] [--jobs 100000] [--workers 5] [--concurrency C]
                          [--batch 10] [--pgqueuer]

Both sides drain the same number of jobs on the same database, through a transport that accepts
every message at once, with the same durability: a claim of ``claim_batch`` jobs committed
(synchronously) before any send, then one commit per job holding its result and its
delivery_attempts row, asynchronous by default as senddock's (``--result-commit sync`` for both). The bare loop
is what a careful engineer would write by hand; senddock adds the per-job start mark (in the same
statement), suppression check at claim, fencing, plugin calls, logging and the finish check.

--workers is the bare loop's threads (one connection each); senddock runs --concurrency sends in
flight (default the same), written as `concurrency` where the installed config schema has it and as
`workers` before issue 14's engine, so one command measures before and after. --pgqueuer adds
pgqueuer 1.6 + asyncpg (bench/pgqueuer_drain.py, --workers QueueManagers x batch 10) to the same
alternation, run from its own virtualenv (bench/.venv-pgqueuer, made on first use with pip).

CPU per job is printed two ways: the whole machine's busy time (/proc/stat; on a shared machine it
counts the neighbours too), and the run's own: this process (where senddock's node or the bare
threads run; the session sampler is a process of its own) plus this database's Postgres backends,
read from /proc.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psycopg
from psycopg.conninfo import conninfo_to_dict
from urllib.parse import quote
from common import (
    BENCH,
    PgSampler,
    admin_dsn,
    bench_config,
    bench_parser,
    engine_settings,
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



def pgqueuer_python(venv: Path) -> Path:
    """The interpreter of pgqueuer's own virtualenv at ``venv``, made (pgqueuer 1.6 + asyncpg, from the
    package index pip is set up with) the first time: pgqueuer is no dependency of senddock's."""
    python = venv / "bin" / "python"
    if not python.exists():
        print(f"  making pgqueuer's virtualenv in {venv} (once)", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "pgqueuer==1.6.0", "asyncpg"], check=True)
    return python


def run_pgqueuer(python: Path, dsn: str, jobs: int, workers: int, batch: int) -> float:
    """pgqueuer_drain.py's rate in jobs/s, in its own virtualenv, with scratch databases of its own on
    ``dsn``'s server (any database of it serves as the administrative DSN)."""
    # asyncpg takes URIs only; psycopg gives its DSNs as key=value.
    params = conninfo_to_dict(dsn)
    uri = (f"postgresql://{quote(params.get('user', 'postgres'))}@{params.get('host', '127.0.0.1')}:"
           f"{params.get('port', 5432)}/{quote(params['dbname'])}")
    done = subprocess.run([str(python), str(BENCH / "pgqueuer_drain.py"), "--dsn", uri, "--jobs", str(jobs),
                           "--workers", str(workers), "--batch", str(batch)], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"pgqueuer_drain.py failed: {done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])["jobs_per_s"]


def measure(dsn: str, jobs: int, workers: int, concurrency: int, batch: int, folder: Path, result_commit: str,
            pgqueuer: Path | None = None, pgqueuer_batch: int = 10, claim_batch: int | None = None) -> dict:
    engine = engine_settings(concurrency, claim_batch=claim_batch)
    if "workers" in engine and claim_batch is None:
        engine = engine_settings(concurrency, claim_batch=batch)  # one thread per send: claim as the bare loop
    config = bench_config(dsn, folder, {"transport": "instant", "plugins": {"load": ["senddock_bench_plugins"]},
                                        **engine,
                                        "database": {"result_commit": result_commit}})
    fill_list(dsn, jobs)
    rates: dict[str, float] = {}
    cpu: dict[tuple[str, str], float] = {}  # (side, machine | own) -> seconds per job, the lower of two
    sides = ("bare", "senddock", "pgqueuer") if pgqueuer else ("bare", "senddock")
    for side in sides * 2:  # alternate, keep the best of two
        if side == "pgqueuer":
            rate = run_pgqueuer(pgqueuer, dsn, jobs, workers, pgqueuer_batch)
            rates[side] = max(rates.get(side, 0), rate)
            print(f"  {side:>8}: {jobs:,} jobs at {rate:,.0f} jobs/s ({workers} managers x batch {pgqueuer_batch}, "
                  f"asyncpg, its own virtualenv)", flush=True)
            continue
        reset_jobs(dsn)
        app = open_app(config, dsn)
        campaign_id, broadcast_id = enqueue(app)
        with PgSampler(dsn, interval=0.05) as seen:
            started, own, machine = time.perf_counter(), time.process_time(), machine_cpu()
            if side == "bare":
                bare_loop(dsn, broadcast_id, workers, batch, result_commit)
            else:
                Runner(config, exit_when_idle=True).run()
            seconds = time.perf_counter() - started
            machine_used, own_used = machine_cpu() - machine, time.process_time() - own
        # The run's own CPU: this process (senddock's node or the bare threads run in it) and the
        # database's backends the run held.
        own_used = None if seen.backend_cpu is None else own_used + seen.backend_cpu
        assert app.campaign_status(campaign_id).sent == jobs
        app.close()
        rate = jobs / seconds
        rates[side] = max(rates.get(side, 0), rate)
        for kind, used in (("machine", machine_used), ("own", own_used)):
            if used is not None:
                cpu[side, kind] = min(cpu.get((side, kind), float("inf")), used / jobs)
        own_text = "" if own_used is None else f"{own_used / jobs * 1e6:.0f} us own (process + backends), "
        print(f"  {side:>8}: {jobs:,} jobs in {seconds:.1f}s = {rate:,.0f} jobs/s "
              f"(CPU per job: {own_text}{machine_used / jobs * 1e6:.0f} us on the whole machine; "
              f"{seen.describe()})", flush=True)

    def us(side: str, kind: str) -> int | None:
        return round(cpu[side, kind] * 1e6) if (side, kind) in cpu else None

    def cpu_ratio(kind: str) -> float | None:
        return round(cpu["senddock", kind] / cpu["bare", kind], 2) if ("bare", kind) in cpu else None

    row = {"jobs": jobs, "workers": workers, "concurrency": concurrency, "bare_claim_batch": batch,
           "senddock_claim_batch": engine.get("claim_batch", "default"),
           "result_commit": result_commit,
           "bare_jobs_per_s": round(rates["bare"]), "senddock_jobs_per_s": round(rates["senddock"]),
           "ratio": round(rates["senddock"] / rates["bare"], 2),
           **{f"{side}_{kind}_cpu_us_per_job": us(side, kind) for side in ("bare", "senddock")
              for kind in ("machine", "own")},
           "cpu_ratio_machine": cpu_ratio("machine"), "cpu_ratio_own": cpu_ratio("own")}
    if pgqueuer:
        row.update(pgqueuer_batch=pgqueuer_batch, pgqueuer_jobs_per_s=round(rates["pgqueuer"]),
                   ratio_vs_pgqueuer=round(rates["senddock"] / rates["pgqueuer"], 2))
    return row


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--workers", type=int, default=5,
                        help="the bare loop's threads (= connections) and pgqueuer's QueueManagers")
    parser.add_argument("--concurrency", type=int, default=None,
                        help="senddock's sends in flight (config concurrency, or workers on an install without "
                             "it); default: --workers")
    parser.add_argument("--batch", type=int, default=10, help="claim batch of the bare loop")
    parser.add_argument("--claim-batch", type=int, default=None,
                        help="senddock's claim_batch (default: its own default, never more than its free send "
                             "slots; --batch on an install whose senddock runs one thread per send)")
    parser.add_argument("--pgqueuer", action="store_true",
                        help="also run bench/pgqueuer_drain.py (batch 10) in the same alternation, from its own "
                             "virtualenv (--pgqueuer-venv, made with pgqueuer 1.6 + asyncpg when missing)")
    parser.add_argument("--pgqueuer-venv", type=Path, default=BENCH / ".venv-pgqueuer")
    parser.add_argument("--result-commit", choices=["async", "sync"], default="async",
                        help="database.result_commit for both sides (senddock's default: async)")
    parser.add_argument("--log", choices=["info", "warning"], default="info",
                        help="senddock's log level; info (the default of `senddock run`) writes one JSON line "
                             "per attempt, here to stderr")
    args = parser.parse_args()
    # As `senddock run` does when its stderr is not a terminal: JSON lines.
    configure_logging(args.log, "json")
    with tempfile.TemporaryDirectory() as folder, scratch_database(admin_dsn(args)) as dsn:
        row = measure(dsn, args.jobs, args.workers, args.concurrency or args.workers, args.batch, Path(folder),
                      args.result_commit, pgqueuer_python(args.pgqueuer_venv) if args.pgqueuer else None,
                      claim_batch=args.claim_batch)
    print(f"senddock {row['senddock_jobs_per_s']:,} jobs/s vs bare loop {row['bare_jobs_per_s']:,} jobs/s: "
          f"ratio {row['ratio']}x (target >= 1.0)")
    if "pgqueuer_jobs_per_s" in row:
        print(f"senddock vs pgqueuer 1.6 + asyncpg (batch {row['pgqueuer_batch']}): {row['pgqueuer_jobs_per_s']:,} "
              f"jobs/s, ratio {row['ratio_vs_pgqueuer']}x (target >= 1.0)")
    print(f"CPU per job, senddock / bare loop: whole machine {row['senddock_machine_cpu_us_per_job']} / "
          f"{row['bare_machine_cpu_us_per_job']} us ({row['cpu_ratio_machine']}x), own (process + backends) "
          f"{row['senddock_own_cpu_us_per_job']} / {row['bare_own_cpu_us_per_job']} us ({row['cpu_ratio_own']}x) "
          f"(target <= 1.2x)")
    print(json.dumps({"benchmark": "drain", **row}))


if __name__ == "__main__":
    main()
