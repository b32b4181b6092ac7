"""Benchmark: sends in flight. `senddock run` with C sends in flight against a bare C-thread smtplib loop, both
delivering to one `senddock sink` process (optionally answering DATA after a delay), in one run.

    python bench/inflight.py [--dsn ADMIN_DSN | --embedded] [--messages 3000] [--concurrency 5 [50 ...]]
                             [--delay 50ms]

The comparison points of issue 14: with no delay, a relay-bound loop on the same number of SMTP
connections; with `--delay 50ms` (a real relay's latency), how far sends in flight scale with C.
The bare side is a script with no queue at all: C threads, one SMTP connection each reused for the
whole run, sending messages built before the clock starts: senddock's own bytes for the same
recipients (its composer's, as the senddock side sends them), since the relay parses each message's
headers and a message with fewer would cost it less. The senddock side drains a campaign of
the same number of one-word messages with `concurrency: C` (`workers: C` on an install whose config
schema has no `concurrency` yet, i.e. before issue 14's engine, so one command measures before and
after; `--workers` is the same option), while a sampler (a process of its own, so it takes no
time from the node's threads) reads `pg_stat_activity` of the scratch database every 20 ms and
prints the node's peak number of sessions, in all and per application_name, against the most a
node may hold (`database.pool_size`, 10, the lifeline included). The node runs with its defaults
but for `concurrency` (its chores once a `poll_interval`, 1 s; `--exit-when-idle` ends it as its
last result is recorded). The sink is a process of its own (as a relay is), started afresh for each side so its
count of received messages belongs to that side alone; every side must deliver every message.
Sides alternate, bare first; the best rate of two is kept, and the lower CPU.
Each side also prints how many SMTP sessions delivered its messages in all, as the sink counts them
(senddock's SMTP transport starts a fresh one every `max_messages_per_connection`, 100, messages;
at most C are open at once on either side).

CPU per message is printed two ways: the whole machine's busy time from /proc/stat (what issue 14's
targets name; on a shared machine it counts the neighbours too), and the run's own: this process,
the sink process and this database's Postgres backends (read from /proc when the server runs here).

A C whose sessions do not fit the server's max_connections fails on the senddock side (before
issue 14's engine a node holds a connection per worker): that is reported with the error (and, when
every message went out but the node did not exit, how long the sends took), the bare side is still
measured, and the next C runs. --timeout bounds each side.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psycopg
from common import (
    Connections,
    PgSampler,
    admin_dsn,
    bench_config,
    bench_parser,
    enqueue,
    engine_settings,
    fill_list,
    machine_cpu,
    open_app,
    process_cpu,
    reset_jobs,
    scratch_database,
)
from smtp_drain import bare_loop, shares

from senddock.cli.logs import configure_logging
from senddock.config import Config
from senddock.core.runner import Runner
from senddock.durations import parse_duration
from senddock.mail import mime
from senddock.mail.compose import Composer
from senddock.outcome import CampaignContent, Recipient

POOL_LIMIT = 10  # database.pool_size's default: the most sessions issue 14 lets a node hold, lifeline included


class SinkProcess:
    """`senddock sink` in a process of its own, on a free port; ``received`` once stopped. With
    ``log``, its line per message (each starting with the time it was accepted) goes to that file."""

    def __init__(self, delay: float, log: Path | None = None) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        # --json: one JSON object on stdout at exit ({"received": N}); the per-message lines go to stderr.
        with open(log or "/dev/null", "wb") as stderr:  # the child keeps its own copy of the descriptor
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "senddock", "sink", "--port", str(self.port), "--delay",
                 f"{delay * 1000:g}ms", "--json"], stdout=subprocess.PIPE, stderr=stderr)
        self.received: int | None = None
        self.connections: int | None = None
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"senddock sink did not start on port {self.port}") from None
                time.sleep(0.05)

    def cpu(self) -> float:
        return process_cpu(self.proc.pid) or 0.0

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        out, _ = self.proc.communicate(timeout=60)
        lines = out.decode().strip().splitlines()
        result = json.loads(lines[-1]) if lines else {}
        self.received = result.get("received")
        self.connections = result.get("connections")  # SMTP sessions that delivered; None before the sink said


@dataclass
class Side:
    seconds: float
    machine_cpu: float  # seconds, the whole machine
    own_cpu: float | None  # seconds: this process + the sink + the database's backends (None: unreadable)
    error: str | None = None
    connections: Connections | None = None  # senddock's side only
    smtp_connections: int | None = None  # SMTP sessions that delivered, as the sink counted them


def senddock_messages(config: Config, messages: int, workers: int) -> list[list[tuple[str, bytes]]]:
    """The bare side's messages, per thread: the bytes senddock sends for the same campaign (common.enqueue's
    one-word text) to the same recipients (common.fill_list's), built by its composer before the clock
    starts. The relay parses every message's headers, so the two sides give it the same work."""
    composer = Composer(config)
    prepared = composer.prepare(CampaignContent(1, "bench", "Hi", "bench@example.com", text_body="Hello",
                                                html_body=None, list_name="bench"))
    built, i = [], 0
    for count in shares(messages, workers):
        mine = []
        for _ in range(count):
            i += 1
            message = composer.message(prepared, Recipient(f"user{i}@example{i % 50}.com", f"User {i}", {}, i),
                                       job_id=i, broadcast_id=1, attempt=1)
            mine.append((message.recipient.email, mime.message_bytes(message)))
        built.append(mine)
    return built


def run_senddock(config, timeout: float) -> str | None:
    """Runner.run() with a deadline; the error that stopped it, or None."""
    runner = Runner(config, exit_when_idle=True)
    error: list[str] = []

    def target() -> None:
        try:
            runner.run()
        except Exception as exc:  # noqa: BLE001 - reported as this side's result
            error.append(f"{type(exc).__name__}: {exc}")

    thread = threading.Thread(target=target, name="senddock-run")
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        runner.request_stop()
        thread.join(60)
        error.append(f"not finished after {timeout:g}s (stopped)")
    return error[0] if error else None


def measure_side(side: str, dsn: str, folder: Path, messages: int, workers: int, delay: float,
                 timeout: float) -> Side:
    sink = SinkProcess(delay)
    try:
        if side == "bare":
            config = bench_config(dsn, folder, {"transport": "smtp", "smtp": {"host": "127.0.0.1", "port": sink.port,
                                                                              "security": "none"}})
            prebuilt = senddock_messages(config, messages, workers)  # outside the clock: the loop only sends
            started, machine, own, sink_cpu = time.perf_counter(), machine_cpu(), time.process_time(), sink.cpu()
            bare_loop(sink.port, messages, workers, prebuilt)
            result = Side(time.perf_counter() - started, machine_cpu() - machine,
                          time.process_time() - own + sink.cpu() - sink_cpu)
        else:
            reset_jobs(dsn)
            config = bench_config(dsn, folder, {
                "transport": "smtp", "smtp": {"host": "127.0.0.1", "port": sink.port, "security": "none"},
                **engine_settings(workers)})
            app = open_app(config, dsn)
            campaign_id, _ = enqueue(app)  # outside the clock, like the bare side's messages
            with PgSampler(dsn) as connections:
                started, machine, own, sink_cpu = time.perf_counter(), machine_cpu(), time.process_time(), sink.cpu()
                wall = time.time()
                error = run_senddock(config, timeout)
                seconds = time.perf_counter() - started
                machine_used, own_used = machine_cpu() - machine, time.process_time() - own + sink.cpu() - sink_cpu
            sent = app.campaign_status(campaign_id).sent
            app.close()
            if error is None and sent != messages:
                error = f"senddock marked {sent} of {messages} sent"
            elif error is not None and sent == messages:
                # A node that sent everything but never exited: say how fast the sends themselves went.
                with psycopg.connect(dsn) as conn:
                    last = conn.execute("SELECT extract(epoch FROM max(sent_at)) FROM broadcast_jobs").fetchone()[0]
                took = float(last) - wall
                error += f"; it had sent all {messages:,} after {took:.1f}s (= {messages / took:,.0f} msg/s)"
            result = Side(seconds, machine_used,
                          None if connections.backend_cpu is None else own_used + connections.backend_cpu,
                          error, connections)
    finally:
        sink.stop()
    result.smtp_connections = sink.connections
    if result.error is None and sink.received != messages:
        result.error = f"the sink received {sink.received} of {messages} messages"
    return result


def measure(dsn: str, messages: int, workers: int, delay: float, folder: Path, timeout: float) -> dict:
    fill_list(dsn, messages)
    results: dict[str, list[Side]] = {"bare": [], "senddock": []}
    for side in ("bare", "senddock", "bare", "senddock"):
        result = measure_side(side, dsn, folder, messages, workers, delay, timeout)
        results[side].append(result)
        pg = f"; {result.connections.describe()}" if result.connections else ""
        if result.error:
            print(f"  {side:>8}: FAILED after {result.seconds:.1f}s: {result.error}{pg}", flush=True)
            continue
        own = "" if result.own_cpu is None else f", own {result.own_cpu / messages * 1e6:,.0f}"
        print(f"  {side:>8}: {messages:,} messages in {result.seconds:.1f}s = {messages / result.seconds:,.0f} msg/s "
              f"over {result.smtp_connections} SMTP sessions in all "
              f"(CPU per message: machine {result.machine_cpu / messages * 1e6:,.0f}{own} us){pg}", flush=True)

    def best(side: str, value, pick):
        """``pick`` (max, min) of ``value`` over the side's runs that delivered everything, or None."""
        values = [value(r) for r in results[side] if r.error is None and value(r) is not None]
        return pick(values) if values else None

    def us(seconds: float | None) -> int | None:
        return None if seconds is None else round(seconds / messages * 1e6)

    rates = {side: best(side, lambda r: messages / r.seconds, max) for side in results}
    peaks: dict[str, int] = {}
    for r in results["senddock"]:  # failed runs too: how many sessions a failing W reached is the point
        for name, count in r.connections.peak_by_application.items() if r.connections else ():
            peaks[name] = max(peaks.get(name, 0), count)
    return {
        "messages": messages, "concurrency": workers, "workers": workers, "delay_ms": round(delay * 1000),
        "bare_messages_per_s": rates["bare"] and round(rates["bare"]),
        "senddock_messages_per_s": rates["senddock"] and round(rates["senddock"]),
        "ratio": round(rates["senddock"] / rates["bare"], 2) if rates["bare"] and rates["senddock"] else None,
        "peak_pg_connections": max((r.connections.peak for r in results["senddock"] if r.connections), default=None),
        "peak_pg_connections_by_application": peaks,
        "pool_limit": POOL_LIMIT,
        **{f"{side}_smtp_sessions": max((r.smtp_connections or 0 for r in results[side]), default=None)
           for side in results},
        **{f"{side}_{kind}_cpu_us_per_message": us(best(side, lambda r, k=kind: getattr(r, f"{k}_cpu"), min))
           for side in results for kind in ("machine", "own")},
        "errors": [f"{side}: {r.error}" for side in results for r in results[side] if r.error],
    }


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--messages", type=int, default=3_000)
    parser.add_argument("--concurrency", "--workers", dest="workers", type=int, nargs="+", default=[5],
                        help="senddock's sends in flight and the bare loop's threads (= SMTP connections); several "
                             "values run in turn")
    parser.add_argument("--delay", type=parse_duration, default=0.0,
                        help="the sink answers DATA after this long (e.g. 50ms; default none)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds one side may take before it is stopped")
    parser.add_argument("--log", choices=["info", "warning"], default="info",
                        help="senddock's log level; info (the default of `senddock run`) writes one JSON line "
                             "per attempt, here to stderr")
    args = parser.parse_args()
    configure_logging(args.log, "json")  # as `senddock run` does when its stderr is not a terminal
    rows = []
    with tempfile.TemporaryDirectory() as folder, scratch_database(admin_dsn(args)) as dsn:
        for workers in args.workers:
            print(f"C={workers}, delay {args.delay * 1000:g} ms, {args.messages:,} messages:", flush=True)
            row = measure(dsn, args.messages, workers, args.delay, Path(folder), args.timeout)
            rows.append(row)
            ratio = f"ratio {row['ratio']}x" if row["ratio"] is not None else "no ratio: " + "; ".join(row["errors"])
            peak = row["peak_pg_connections"]
            verdict = "within" if peak is not None and peak <= POOL_LIMIT else "OVER"
            print(f"  senddock {row['senddock_messages_per_s'] or '-'} msg/s vs bare smtplib "
                  f"{row['bare_messages_per_s'] or '-'} msg/s: {ratio} (target >= 0.8); peak {peak} Postgres "
                  f"sessions for the node: {verdict} the limit of {POOL_LIMIT} (database.pool_size)", flush=True)
    print(json.dumps({"benchmark": "inflight", "rows": rows}))
    sys.exit(1 if any(row["errors"] for row in rows) else 0)


if __name__ == "__main__":
    main()
