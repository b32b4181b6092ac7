"""Benchmark: peak memory (RSS) of a `senddock run --exit-when-idle` process, by broadcast size.

    python bench/rss.py [--dsn ADMIN_DSN | --embedded] [--sizes 100000 1000000] [--workers 5]

For each size: a list of that many subscribers, one campaign sent (enqueued through the senddock
API, before and outside the measurement), then a separate `senddock run --exit-when-idle` process
drains it through the bench "instant" transport, run under GNU time (/usr/bin/time -f %M), which
reports that one process's peak RSS as the kernel counted it (ru_maxrss); psutil sampling every
100 ms is printed beside it as a cross-check (it may read a few hundred KB above the kernel's peak:
the kernel batches per-thread RSS counters). A queue that streams its work should need about the
same memory at 1M as at 100k: the target is a ratio (largest size / smallest) of at most 1.2.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
from common import (
    BENCH,
    admin_dsn,
    bench_config,
    bench_parser,
    enqueue,
    fill_list,
    open_app,
    scratch_database,
)

from senddock.cli.logs import configure_logging

SENDDOCK = Path(sys.executable).with_name("senddock")
# Not wait4()/RUSAGE_CHILDREN on a Popen child: Popen spawns with vfork, and exec then carries the
# parent's own high-water RSS into the child's ru_maxrss. GNU time forks from a tiny process.
TIME = "/usr/bin/time"


def run_child(config_path: Path, dsn: str, workers: int, folder: Path) -> tuple[float, float, float, int]:
    """(kernel peak MB, sampled peak MB, seconds, exit code) of one `senddock run` process."""
    env = {**os.environ, "SENDDOCK_DATABASE_URL": dsn,
           # The child must import senddock_bench_plugins named in plugins.load.
           "PYTHONPATH": os.pathsep.join(filter(None, [str(BENCH), os.environ.get("PYTHONPATH")]))}
    report = folder / "maxrss"
    command = [TIME, "-o", str(report), "-f", "%M",
               str(SENDDOCK), "run", "--exit-when-idle", "-c", str(config_path), "--workers", str(workers)]
    started = time.perf_counter()
    # stderr to /dev/null: not a terminal, so the child logs buffered JSON lines as in production.
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    sampled = 0
    while proc.poll() is None:
        try:
            for child in psutil.Process(proc.pid).children():  # senddock itself, under time
                sampled = max(sampled, child.memory_info().rss)
        except psutil.NoSuchProcess:  # exiting between two calls
            pass
        time.sleep(0.1)
    seconds = time.perf_counter() - started
    peak_kib = int(report.read_text().split()[-1])  # %M: the child's maximum RSS in KiB
    return peak_kib / 1024, sampled / 2**20, seconds, proc.returncode


def measure(dsn: str, sizes: list[int], workers: int, log: str, folder: Path) -> dict:
    config = bench_config(dsn, folder, {"transport": "instant", "plugins": {"load": ["senddock_bench_plugins"]},
                                        "workers": workers, "poll_interval": "100ms", "logging": {"level": log}})
    config_path = folder / "senddock.yaml"  # written by bench_config, read again by the child
    peaks: dict[int, float] = {}
    for size in sizes:
        fill_list(dsn, size)  # empties every table first
        app = open_app(config, dsn)
        campaign_id, _ = enqueue(app)
        app.close()
        peak, sampled, seconds, code = run_child(config_path, dsn, workers, folder)
        if code != 0:
            raise SystemExit(f"senddock run exited with status {code} at size {size:,}")
        app = open_app(config, dsn)
        sent = app.campaign_status(campaign_id).sent
        app.close()
        assert sent == size, f"the child sent {sent} of {size}"
        peaks[size] = peak
        print(f"  {size:>10,} jobs: peak RSS {peak:.1f} MB (psutil sampled {sampled:.1f} MB), "
              f"drained in {seconds:.1f}s = {size / seconds:,.0f} jobs/s", flush=True)
    smallest, largest = min(sizes), max(sizes)
    return {"sizes": sizes, "workers": workers, "log_level": log,
            "peak_rss_mb": {str(size): round(peaks[size], 1) for size in sizes},
            "ratio": round(peaks[largest] / peaks[smallest], 2), "target_ratio": 1.2}


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--workers", type=int, default=5)
    parser.add_argument("--log", choices=["info", "warning"], default="info",
                        help="the child's log level; info (the default) logs one JSON line per attempt")
    args = parser.parse_args()
    # senddock's own log lines in this process (migrations) go to stderr, never among the results.
    configure_logging("info", "json")
    if len(args.sizes) < 2:
        parser.error("--sizes needs at least two sizes to compare")
    with tempfile.TemporaryDirectory() as folder, scratch_database(admin_dsn(args)) as dsn:
        row = measure(dsn, args.sizes, args.workers, args.log, Path(folder))
    print(f"peak RSS at {max(args.sizes):,} jobs is {row['ratio']}x the peak at {min(args.sizes):,} (target <= 1.2)")
    print(json.dumps({"benchmark": "rss", **row}))


if __name__ == "__main__":
    main()
