"""The measuring tools of bench/ that issue 14's baselines rest on: the sampler of Postgres sessions
(and their CPU), a `senddock sink` process taking 200 connections at once, the rates read from the
sink's log, and the chart of the benches' JSON lines."""

from __future__ import annotations

import json
import smtplib
import sys
import threading
from datetime import datetime, timezone
from pathlib import Path
from xml.etree import ElementTree

import psycopg
import yaml

from senddock.config import base_schema
from senddock.loading import load_config

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from common import PgSampler, engine_settings, process_cpu  # noqa: E402
from inflight import SinkProcess  # noqa: E402
from plot import scenarios, svg  # noqa: E402
from windows import busiest, judge_windows, sink_log_times, window_counts  # noqa: E402


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
    # The lower bound only says it was counted at all: on a busy machine it measured under a tenth.
    assert before is not None and seen.backend_cpu is not None
    assert before / 20 <= seen.backend_cpu <= before / 2, (before, seen.backend_cpu)


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
    assert sink.connections == 200  # one SMTP session per thread, counted by the sink


def test_window_counts_leave_out_the_burst_and_the_cut_short_last_window():
    # A burst of 5 at t=0, then 2 per second for 25 s: two whole 10 s windows of 20, a third cut short.
    times = [0.0] * 5 + [0.5 * i for i in range(50)]
    assert window_counts(times, 10.0, skip=5) == [20, 20]
    # Without leaving the burst out, the first window holds it too.
    assert window_counts(times, 10.0) == [25, 20]
    assert window_counts([], 10.0) == []
    assert window_counts([3.0, 4.0], 10.0) == []  # shorter than one window: none whole


def test_judge_windows_names_each_window_outside_the_tolerance():
    assert judge_windows([600, 612, 588], 10.0, 60.0, 0.05) == []
    problems = judge_windows([600, 640, 560], 10.0, 60.0, 0.05)
    assert problems == ["window 2 (10-20 s): 64/s, outside 60/s ± 5%",
                        "window 3 (20-30 s): 56/s, outside 60/s ± 5%"]
    assert judge_windows([], 10.0, 60.0, 0.05) == ["no whole 10 s window: the run was shorter than that"]


def test_busiest_counts_the_most_in_any_window_starting_at_an_event():
    times = [0.0, 0.5, 0.9, 0.95, 1.5, 3.0]
    assert busiest(times, 1.0) == 4  # from 0.0; every later start holds fewer
    assert busiest([0.0, 0.5, 1.0], 1.0) == 2  # half-open: 1.0 is the next second's
    assert busiest(times, 1.0, weights=[1, 1, 1, 1, 1, 10]) == 10
    assert busiest([], 1.0) == 0


def test_sink_log_times_reads_the_sink_lines_and_skips_the_rest():
    lines = ["senddock sink listening on 127.0.0.1:1025 (Ctrl-C to stop)",
             "2026-12-03T10:00:01.500+00:00  b@example.com  <2@x>  Hi",
             "2026-12-03T10:00:00.250+00:00  a@example.com  <1@x>  Hi", ""]
    first, second = sink_log_times(lines)
    assert second - first == 1.25
    assert first == datetime(2026, 12, 3, 10, 0, 0, 250000, tzinfo=timezone.utc).timestamp()


def test_plot_draws_each_scenario_scaled_to_its_baseline():
    lines = [
        "  bare: 300 jobs ...",  # the benches' human lines are skipped
        json.dumps({"benchmark": "drain", "workers": 5, "concurrency": 50, "bare_jobs_per_s": 4000,
                    "senddock_jobs_per_s": 2000, "pgqueuer_jobs_per_s": 8000}),
        json.dumps({"benchmark": "inflight", "rows": [
            {"workers": 200, "concurrency": 200, "delay_ms": 50, "bare_messages_per_s": 800,
             "senddock_messages_per_s": 640},
            {"workers": 150, "delay_ms": 50, "bare_messages_per_s": None, "senddock_messages_per_s": None}]}),
        json.dumps({"benchmark": "chaos", "passed": True}),  # no rates: not drawn
    ]
    groups = scenarios(lines)
    assert [(g.label, g.bars) for g in groups] == [
        ("null transport, C=50", (("bare loop", 4000), ("senddock", 2000), ("pgqueuer", 8000))),
        ("SMTP sink, 50 ms DATA, C=200", (("bare smtplib", 800), ("senddock", 640))),
    ]
    chart = ElementTree.fromstring(svg(groups))  # well-formed XML
    widths = {rect.find("{http://www.w3.org/2000/svg}title").text: float(rect.get("width"))
              for rect in chart.iter("{http://www.w3.org/2000/svg}rect")}
    # pgqueuer at 200% of its baseline is the longest bar and sets the scale: a baseline is half of it.
    assert widths["pgqueuer: 8,000 jobs/s"] == 2 * widths["bare loop: 4,000 jobs/s"]
    assert widths["senddock: 2,000 jobs/s"] == widths["bare loop: 4,000 jobs/s"] / 2
    assert abs(widths["senddock: 640 msg/s"] / widths["bare smtplib: 800 msg/s"] - 0.8) < 0.01


def test_engine_settings_say_sends_in_flight_in_the_installed_schema(tmp_path: Path):
    """Before issue 14's engine the schema has `workers` only, after it `concurrency` too: whichever
    key engine_settings picks, the config loads with the count under it and claim_batch only if known."""
    settings = engine_settings(7, claim_batch=3)
    known = base_schema()["properties"]
    assert set(settings) <= {"concurrency", "workers", "claim_batch"}
    assert ("concurrency" in settings) == ("concurrency" in known)
    assert ("claim_batch" in settings) == ("claim_batch" in known)
    path = tmp_path / "senddock.yaml"
    path.write_text(yaml.safe_dump(settings), encoding="utf-8")
    config = load_config(path, environ={"SENDDOCK_DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none"})
    key = "concurrency" if "concurrency" in settings else "workers"
    assert config.data[key] == 7
