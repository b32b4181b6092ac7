"""Benchmark: a global rate held by several real nodes, as the relay sees it.

    python bench/paced_nodes.py [--dsn ADMIN_DSN | --embedded] [--nodes 3] [--rate 60/s] [--burst N]
                                [--recipients 3000] [--concurrency C] [--connect-at-start]
                                [--latency-margin 250ms] [--tolerance 0.05]

One campaign of --recipients one-word messages, sent by --nodes `senddock run --exit-when-idle`
processes sharing one config with `pacing: {global: RATE}` (or `{rate, burst}` with --burst), to
one `senddock sink` process whose log line per message starts with the time it accepted it. The
rate is read from that log, the relay's clock, not senddock's:

  - the rate over every whole 10 s window from the first message (the burst an idle limit lets go
    at once, `pacing.latency_margin` kept back, is left out, as bench/pacing.py does; the last
    window, cut short by the end of the campaign, is not judged): passes within --tolerance (±5%)
    of the rate;
  - the most messages in any 1 s (a window starting at each message): passes at most rate + burst,
    GCRA's bound at the relay. `--latency-margin 0s` applies the burst as written: a busy relay takes
    the burst's sends in turn, so they arrive late, together with the next second's.

Exit status 0 when both pass (and every recipient was received exactly once), 1 otherwise. Before
issue 14's engine the pacing section is validated but not applied: the nodes send as fast as they
can and the check fails, which is the "before" figure. --concurrency sets each node's sends in
flight (`concurrency`, or `workers` on an install without it); by default the config's own.
bench/pacing.py measures the limiter alone (takes, no sends).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from common import admin_dsn, bench_parser, engine_settings, enqueue, fill_list, open_app, scratch_database
from inflight import SinkProcess
from windows import busiest, judge_windows, sink_log_times, window_counts

from senddock.cli.logs import configure_logging
from senddock.loading import load_config
from senddock.pacing.rates import parse_rate

WINDOW = 10.0  # seconds: the span issue 14 judges a rate over


def node_config(folder: Path, port: int, rate: str, burst: int | None, concurrency: int | None,
                connect_at_start: bool = False, latency_margin: str | None = None) -> Path:
    smtp = {"host": "127.0.0.1", "port": port, "security": "none"}
    if connect_at_start:
        smtp["connect_at_start"] = True  # not on an install whose smtp section has no such key
    pacing = {"global": rate if burst is None else {"rate": rate, "burst": burst}}
    if latency_margin is not None:
        pacing["latency_margin"] = latency_margin  # not on an install whose pacing has no such key
    settings = {
        "transport": "smtp", "smtp": smtp, "pacing": pacing,
        "poll_interval": "100ms", "logging": {"level": "warning", "format": "json"},
        **(engine_settings(concurrency) if concurrency else {}),
    }
    path = folder / "senddock.yaml"
    path.write_text(yaml.safe_dump(settings), encoding="utf-8")
    return path


def at_once(rate, margin: float) -> int:
    """Sends the idle limit lets go at once (``Rate.at_once``; the burst on an install without it)."""
    return rate.at_once(margin) if hasattr(rate, "at_once") else rate.burst


def run_nodes(config: Path, dsn: str, nodes: int, folder: Path, timeout: float) -> list[str]:
    """Start the nodes together and wait for each to exit; what went wrong, per node."""
    env = {**os.environ, "SENDDOCK_DATABASE_URL": dsn}
    procs = []
    for i in range(nodes):
        log = open(folder / f"node-{i}.log", "wb")  # noqa: SIM115 - closed below, once the node is gone
        procs.append((subprocess.Popen([sys.executable, "-m", "senddock", "run", "-c", str(config), "--node",
                                        f"paced-{i}", "--exit-when-idle"], env=env, stdin=subprocess.DEVNULL,
                                       stdout=subprocess.DEVNULL, stderr=log), log))
    problems = []
    deadline = time.monotonic() + timeout
    for i, (proc, log) in enumerate(procs):
        try:
            proc.wait(max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.terminate()
            proc.wait(30)
            problems.append(f"node paced-{i} not finished after {timeout:g}s (stopped)")
        log.close()
        if proc.returncode not in (0, None) and not problems:
            tail = (folder / f"node-{i}.log").read_text(errors="replace").strip().splitlines()[-3:]
            problems.append(f"node paced-{i} exited with {proc.returncode}: {' | '.join(tail)}")
    return problems


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--rate", default="60/s")
    parser.add_argument("--burst", type=int, default=None, help="default: the config's (one second's worth)")
    parser.add_argument("--recipients", type=int, default=3_000)
    parser.add_argument("--concurrency", type=int, default=None,
                        help="sends in flight per node (default: the config's)")
    parser.add_argument("--connect-at-start", action="store_true",
                        help="smtp.connect_at_start: each sender opens its connection before the first claim")
    parser.add_argument("--latency-margin", default=None,
                        help="pacing.latency_margin, e.g. 0s or 100ms (default: the config's)")
    parser.add_argument("--tolerance", type=float, default=0.05, help="of the rate, per 10 s window")
    parser.add_argument("--timeout", type=float, default=None,
                        help="seconds the nodes may take (default: twice the paced time, at least 60)")
    args = parser.parse_args()
    configure_logging("warning", "json")
    rate = parse_rate(args.rate, args.burst)
    timeout = args.timeout or max(60.0, 2 * args.recipients / rate.per_second)
    with tempfile.TemporaryDirectory() as tmp, scratch_database(admin_dsn(args)) as dsn:
        folder = Path(tmp)
        sink_log = folder / "sink.log"
        sink = SinkProcess(0.0, log=sink_log)
        try:
            config_path = node_config(folder, sink.port, args.rate, args.burst, args.concurrency,
                                      args.connect_at_start, args.latency_margin)
            fill_list(dsn, args.recipients)
            config = load_config(config_path, environ={**os.environ, "SENDDOCK_DATABASE_URL": dsn})
            margin = getattr(config.pacing, "latency_margin", 0.0)  # 0 on an install without one
            app = open_app(config, dsn)
            campaign_id, _ = enqueue(app)
            print(f"{args.nodes} nodes, pacing global {rate}, latency margin {margin:g}s "
                  f"({at_once(rate, margin)} at once), {args.recipients:,} recipients", flush=True)
            problems = run_nodes(config_path, dsn, args.nodes, folder, timeout)
            sent = app.campaign_status(campaign_id).sent
            app.close()
        finally:
            sink.stop()
        times = sink_log_times(sink_log.read_text(encoding="utf-8").splitlines())
    if sent != args.recipients or sink.received != args.recipients or len(times) != args.recipients:
        problems.append(f"senddock marked {sent}, the sink received {sink.received} (its log lists {len(times)}) "
                        f"of {args.recipients:,}")
    burst_sent = at_once(rate, margin)  # the burst as the limiter lets it go, left out of the windows
    counts = window_counts(times, WINDOW, skip=burst_sent)
    problems += judge_windows(counts, WINDOW, rate.per_second, args.tolerance)
    most = busiest(times, 1.0)
    bound = rate.per_second + rate.burst
    if most > bound:
        problems.append(f"{most} messages in one second, above rate + burst = {bound:g}")
    span = times[-1] - times[0] if len(times) > 1 else 0.0
    overall = (len(times) - burst_sent) / span if span else None
    print(f"  the sink received {len(times):,} in {span:.1f}s"
          + (f" = {overall:.2f}/s after the burst" if overall else ""), flush=True)
    print(f"  per {WINDOW:g} s window: " + (", ".join(f"{c / WINDOW:g}/s" for c in counts) or "none whole")
          + f" (target {rate.per_second:g}/s ± {args.tolerance:.0%})")
    print(f"  busiest second: {most} messages (bound: rate + burst = {bound:g})")
    print("PASS" if not problems else "FAIL: " + "; ".join(problems))
    print(json.dumps({"benchmark": "paced_nodes", "nodes": args.nodes, "rate_per_s": rate.per_second,
                      "burst": rate.burst, "latency_margin_s": margin, "burst_at_once": burst_sent,
                      "connect_at_start": args.connect_at_start,
                      "recipients": args.recipients, "received": len(times),
                      "span_s": round(span, 3), "rate_after_burst_per_s": overall and round(overall, 3),
                      "window_s": WINDOW, "window_rates_per_s": [c / WINDOW for c in counts],
                      "busiest_second": most, "bound_per_second": bound, "tolerance": args.tolerance,
                      "passed": not problems, "problems": problems}))
    sys.exit(0 if not problems else 1)


if __name__ == "__main__":
    main()
