"""Log lines: one JSON object per line on stderr, libraries' standard-library records included."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time

import structlog

from senddock.cli.logs import configure_logging, flush_logs


def test_a_librarys_stdlib_warning_is_a_json_line_with_the_password_masked(capsys):
    configure_logging("info", "json")
    try:
        logging.getLogger("psycopg.pool").warning(
            "error connecting in %r: connection to postgresql://mailer:s3cret@db/senddock failed", "senddock")
        logging.getLogger("psycopg.pool").info("a library's chatter stays out")
        structlog.get_logger("senddock.test").info("ours", n=1)
        flush_logs()
        lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    finally:
        structlog.reset_defaults()
        logging.getLogger().handlers = []
    records = [json.loads(line) for line in lines]  # every line is one JSON object
    assert [(r["event"], r["level"]) for r in records] == [("database_unreachable", "warning"), ("ours", "info")]
    assert records[0]["logger"] == "psycopg.pool"
    assert records[0]["error"].startswith("error connecting in 'senddock': connection to postgresql://mailer:")
    assert "s3cret" not in lines[0]


def test_the_pools_attempts_to_reconnect_are_one_line_per_interval_with_their_count(capsys, monkeypatch):
    """psycopg_pool says so at every attempt, in a line per host: about 10 a second per node."""
    from senddock.cli import logs

    monkeypatch.setattr(logs, "UNREACHABLE_EVERY", 0.3)
    configure_logging("info", "json")
    pool = logging.getLogger("psycopg.pool")
    failure = ("error connecting in 'senddock': connection failed: connection to server at \"10.0.0.1\", port 5432 "
               "failed: Connection refused\nMultiple connection attempts failed. All failures were:\n- host: ...")
    try:
        for _ in range(40):
            pool.warning(failure)
        time.sleep(0.35)
        for _ in range(5):
            pool.warning(failure)
        flush_logs()
        records = [json.loads(line) for line in capsys.readouterr().err.splitlines() if line.strip()]
    finally:
        structlog.reset_defaults()
        logging.getLogger().handlers = []
    assert [(r["event"], r["attempts"]) for r in records] == [("database_unreachable", 1), ("database_unreachable", 40)]
    assert all("\n" not in r["error"] and "Multiple" not in r["error"] for r in records)


# A process whose stderr is a pipe nobody reads: far more than the pipe's 64 KB of lines, then a
# line from another thread, which must not wait for the reader (the flusher alone does).
_STALLED_STDERR = """
import sys, threading, time
import structlog
from senddock.cli import logs
logs.MAX_BUFFERED = 3000
logs.configure_logging("info", "json")
log = structlog.get_logger("senddock.test")
for i in range(2000):
    log.warning("job_recovered", job_id=i, status="retry", in_doubt=True, dead_node="n" * 100)
time.sleep(3 * logs.FLUSH_INTERVAL)  # the flusher is blocked on the full pipe by now
done = threading.Event()
threading.Thread(target=lambda: (log.warning("next", n=1), [log.info("more", n=i) for i in range(4000)], done.set()),
                 daemon=True).start()
print("logged" if done.wait(5) else "blocked", flush=True)
sys.stdin.readline()  # the test reads stderr now: every line out, in order, and the drops counted
logs.flush_logs()
"""


def test_a_stderr_that_takes_no_lines_blocks_no_thread_but_the_flusher():
    process = subprocess.Popen([sys.executable, "-c", _STALLED_STDERR], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        said = process.stdout.readline().strip()
        process.stdin.write("\n")
        process.stdin.flush()
        err = process.stderr.read()
        process.wait(30)
    finally:
        process.kill()
    assert said == "logged"
    records = [json.loads(line) for line in err.splitlines() if line.strip()]
    recovered = [r["job_id"] for r in records if r["event"] == "job_recovered"]
    assert recovered == list(range(2000))  # in order, none lost
    assert [r["event"] for r in records].count("next") == 1
    # 3,000 lines may wait while the flusher is blocked: the first come, in order; those past the
    # bound are dropped and counted once the writes go through.
    more = [r["n"] for r in records if r["event"] == "more"]
    assert more == list(range(len(more))) and len(more) < 4000
    assert [r["lines"] for r in records if r["event"] == "log_lines_dropped"] == [4000 - len(more)]
