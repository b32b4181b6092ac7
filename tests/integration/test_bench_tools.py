"""The measuring tools of bench/ that issue 14's baselines rest on: the sampler of Postgres sessions
(and their CPU) and a `senddock sink` process taking 200 connections at once."""

from __future__ import annotations

import smtplib
import sys
import threading
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from common import PgSampler, process_cpu  # noqa: E402
from inflight import SinkProcess  # noqa: E402


def test_sampler_reports_the_peak_sessions_per_application_and_their_cpu(database_dsn: str):
    outside = psycopg.connect(database_dsn, autocommit=True, application_name="before")  # counted, CPU from the start
    bench = psycopg.connect(database_dsn, autocommit=True, application_name="senddock-bench")  # the bench's own: not
    try:
        # CPU spent before the sampler starts is not the run's: five times the query inside.
        outside.execute("SELECT count(*) FROM generate_series(1, 15000000)")
        before = process_cpu(outside.info.backend_pid)
        with PgSampler(database_dsn, interval=0.01) as seen:
            opened = [psycopg.connect(database_dsn, autocommit=True, application_name=name)
                      for name in ("a", "a", "a", "b", "b")]
            opened[0].execute("SELECT count(*) FROM generate_series(1, 3000000)")
            for conn in opened:
                conn.close()
            # Fewer afterwards, but the peak stays; a new name shows up with its own peak.
            with psycopg.connect(database_dsn, autocommit=True, application_name="c"):
                threading.Event().wait(0.1)
    finally:
        outside.close()
        bench.close()
    assert seen.peak == 6  # 5 + "before"; the sampler's own session and the bench's are left out
    assert seen.peak_by_application == {"before": 1, "a": 3, "b": 2, "c": 1}
    assert seen.samples >= 3
    # The query inside costs about a fifth of the one before; counting that one too would pass it.
    assert before is not None and seen.backend_cpu is not None
    assert before / 10 <= seen.backend_cpu <= before / 2, (before, seen.backend_cpu)


def test_sink_process_takes_200_connections_at_once_with_a_delay():
    sink = SinkProcess(delay=0.05)
    errors: list[str] = []
    start = threading.Barrier(200)

    def send(i: int) -> None:
        start.wait()
        try:
            with smtplib.SMTP("127.0.0.1", sink.port, timeout=30) as conn:
                for j in range(3):
                    conn.sendmail("a@example.com", [f"r{i}_{j}@example.com"], b"Subject: x\r\n\r\nx\r\n")
        except Exception as exc:  # noqa: BLE001 - every failure is the finding
            errors.append(repr(exc))

    threads = [threading.Thread(target=send, args=(i,)) for i in range(200)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        sink.stop()
    assert errors == []
    assert sink.received == 600
