"""Benchmark: how soon a `senddock run` node killed with SIGKILL sends again once restarted.

    python bench/restart.py [--dsn ADMIN_DSN | --embedded] [--jobs 20000] [--rounds 3] [--kill-after 300]

One node (--node benchnode) sends a broadcast over SMTP to an in-process sink. After --kill-after
sends it is killed with SIGKILL and started again, --rounds times. For each restart: seconds from
Popen to the new incarnation's first send (its first delivery_attempts row that is not an in-doubt
record, polled every 10 ms), and whether the jobs the dead incarnation left 'sending' were taken back.
recovery.lease is 30 s and the heartbeat 1 s, so jobs freed within a couple of seconds can only have
been recovered through the lock-based proof of death of the node's own earlier incarnation.
The first start, with nothing to recover, is the same run's reference: a restart costs a process
start (imports, config, schema check, node registration) plus the recovery; the ratio shows the
recovery's share. Target: under 2 s. The last incarnation is stopped with SIGTERM, then the sink is
checked against the jobs marked sent (nothing lost; extra messages only from in-doubt jobs).
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
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
from senddock.sink import Sink

SENDDOCK = Path(sys.executable).with_name("senddock")
NODE = "benchnode"
FIRST_SEND = """
SELECT (SELECT count(*) FROM nodes WHERE NOT (id = ANY(%(known)s))) > 0,
       EXISTS (SELECT 1 FROM delivery_attempts
                WHERE id > %(base)s AND outcome <> 'in_doubt' AND NOT (node_id = ANY(%(known)s)))
"""


def scalar(conn: psycopg.Connection, sql: str, params: dict | None = None):
    return conn.execute(sql, params or {}).fetchone()[0]


def wait_for(what: str, check, timeout: float, interval: float, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            tail = log.read_text(errors="replace").splitlines()[-20:] if log.exists() else []
            raise SystemExit(f"timed out waiting for {what}; the node's last log lines:\n" + "\n".join(tail))
        time.sleep(interval)


def start(conn: psycopg.Connection, command: list[str], env: dict, log: Path) -> tuple[subprocess.Popen, dict]:
    """Start an incarnation; return it with the seconds to its registration and to its first send."""
    known = [row[0] for row in conn.execute("SELECT id FROM nodes")]
    base = scalar(conn, "SELECT coalesce(max(id), 0) FROM delivery_attempts")
    marks: dict[str, float] = {}
    started = time.perf_counter()
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=log.open("ab"))

    def sent_again() -> bool:
        registered, sent = conn.execute(FIRST_SEND, {"known": known, "base": base}).fetchone()
        now = time.perf_counter() - started
        if registered:
            marks.setdefault("registered_s", now)
        if sent:
            marks["first_send_s"] = now
        return sent or proc.poll() is not None

    wait_for("the first send", sent_again, 60, 0.01, log)
    if "first_send_s" not in marks:
        raise SystemExit(f"senddock run exited with status {proc.returncode} before sending; see {log}")
    return proc, {k: round(v, 3) for k, v in marks.items()}


def measure(dsn: str, jobs: int, rounds: int, kill_after: int, folder: Path) -> dict:
    fill_list(dsn, jobs)
    with Sink("127.0.0.1", 0) as sink:
        config = bench_config(dsn, folder, {
            "transport": "smtp", "smtp": {"host": "127.0.0.1", "port": sink.port, "security": "none"}, "workers": 5,
            "recovery": {"heartbeat": "1s", "lease": "30s"}, "logging": {"level": "info"}})
        app = open_app(config, dsn)
        enqueue(app)
        app.close()
        env = {**os.environ, "SENDDOCK_DATABASE_URL": dsn}
        command = [str(SENDDOCK), "run", "-c", str(folder / "senddock.yaml"), "--node", NODE]
        log = folder / "node.log"
        sent_sql = "SELECT count(*) FROM broadcast_jobs WHERE status = 'sent'"
        in_doubt_sql = "SELECT count(*) FROM delivery_attempts WHERE outcome = 'in_doubt'"
        restarts = []
        with psycopg.connect(dsn, autocommit=True) as conn:
            proc, cold = start(conn, command, env, log)
            print(f"  first start (nothing to recover): registered after {cold['registered_s']:.2f}s, "
                  f"first send after {cold['first_send_s']:.2f}s", flush=True)
            try:
                for round_no in range(1, rounds + 1):
                    target = scalar(conn, sent_sql) + kill_after
                    wait_for(f"{kill_after} more sends", lambda: scalar(conn, sent_sql) >= target, 300, 0.05, log)
                    proc.send_signal(signal.SIGKILL)
                    proc.wait()
                    dead = scalar(conn, "SELECT id FROM nodes WHERE name = %(name)s AND pid = %(pid)s "
                                        "ORDER BY started_at DESC LIMIT 1", {"name": NODE, "pid": proc.pid})
                    left_sql = "SELECT count(*) FROM broadcast_jobs WHERE status = 'sending' AND claimed_by = %(id)s"
                    at_kill, sent_at_kill = scalar(conn, left_sql, {"id": dead}), scalar(conn, sent_sql)
                    doubt_before = scalar(conn, in_doubt_sql)
                    if sent_at_kill >= jobs:
                        raise SystemExit("the broadcast finished before the last kill: raise --jobs")
                    proc, marks = start(conn, command, env, log)
                    # Recovery runs before the workers start, so by the first send nothing may be left.
                    left = scalar(conn, left_sql, {"id": dead})
                    in_doubt = scalar(conn, in_doubt_sql) - doubt_before  # written by this recovery
                    restarts.append({"round": round_no, "sent_at_kill": sent_at_kill, "sending_at_kill": at_kill,
                                     "sending_left_at_first_send": left, "in_doubt": in_doubt, **marks})
                    print(f"  restart {round_no}: killed at {sent_at_kill:,} sent with {at_kill} jobs 'sending'; "
                          f"registered after {marks['registered_s']:.2f}s, first send after "
                          f"{marks['first_send_s']:.2f}s; dead node's jobs still 'sending': {left} "
                          f"({in_doubt} recorded in doubt)", flush=True)
            finally:
                proc.send_signal(signal.SIGTERM)  # the final incarnation stops cleanly
                try:
                    code = proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    code = proc.wait()
            print(f"  last incarnation stopped by SIGTERM with exit status {code}", flush=True)
            in_doubt, sent = scalar(conn, in_doubt_sql), scalar(conn, sent_sql)
            # Rescued in-doubt jobs are due at once but queue behind the broadcast's older pending jobs
            # (the claim takes the oldest next_attempt_at first), so most are not sent again by now.
            waiting = scalar(conn, "SELECT count(*) FROM broadcast_jobs WHERE status = 'retry' AND rescues > 0")
        ids = Counter(message.message_id for message in sink.received)
        duplicates = sum(n - 1 for n in ids.values() if n > 1)
    # Messages at the sink whose job is not 'sent' can only be in-doubt jobs that were delivered before
    # the kill and await their resend; fewer distinct messages than sent jobs would be a lost message.
    unsent_delivered = len(ids) - sent
    consistent = 0 <= unsent_delivered <= waiting
    if not consistent:
        print(f"  INCONSISTENT: {sent} jobs sent, {len(ids)} distinct messages at the sink, "
              f"{waiting} rescued jobs awaiting their resend", flush=True)
    median = statistics.median(r["first_send_s"] for r in restarts)
    return {"jobs": jobs, "rounds": rounds, "kill_after": kill_after, "restarts": restarts,
            "cold_start_first_send_s": cold["first_send_s"], "median_first_send_s": round(median, 3),
            "ratio_to_cold_start": round(median / cold["first_send_s"], 2), "target_s": 2.0,
            "all_recovered": all(r["sending_left_at_first_send"] == 0 for r in restarts),
            "in_doubt_records": in_doubt, "in_doubt_awaiting_resend": waiting,
            "delivered_before_kill_awaiting_resend": unsent_delivered, "duplicates_at_sink": duplicates,
            "sent_jobs": sent, "distinct_messages_at_sink": len(ids), "sink_consistent": consistent,
            "final_exit_status": code}


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--kill-after", type=int, default=300, help="sends between a (re)start and the next kill")
    args = parser.parse_args()
    # senddock's own log lines in this process (migrations) go to stderr, never among the results.
    configure_logging("info", "json")
    with tempfile.TemporaryDirectory() as folder, scratch_database(admin_dsn(args)) as dsn:
        row = measure(dsn, args.jobs, args.rounds, args.kill_after, Path(folder))
    print(f"first send {row['median_first_send_s']:.2f}s after a restart (median of {args.rounds}; target < 2 s), "
          f"{row['ratio_to_cold_start']}x a first start; every dead incarnation's job recovered: "
          f"{row['all_recovered']}; {row['in_doubt_records']} jobs in doubt, of which "
          f"{row['delivered_before_kill_awaiting_resend']} reached the sink before the kill and "
          f"{row['in_doubt_awaiting_resend']} still await their resend; sink consistent: {row['sink_consistent']}")
    print(json.dumps({"benchmark": "restart", **row}))


if __name__ == "__main__":
    main()
