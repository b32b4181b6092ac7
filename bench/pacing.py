"""Benchmark: the shared limiter under several nodes, each a thread with its own connection.

    python bench/pacing.py [--dsn ADMIN_DSN | --embedded] [--nodes 3] [--rate 60/s] [--burst 5]
                           [--seconds 10] [--most 10]

Every node takes 1..--most sends at a time from one limit (``global``) with pacing_take, and when
held back sleeps until the next_at the statement returned, as a claimer will. Nothing is sent: this
measures the limiter alone. Prints the rate admitted over the run (by the statements' own clock,
from the first admission to the last; the burst the idle limit let go at once is left out) against
the configured one (target: 1.0, never above), the most sends admitted in any
second (GCRA's bound: rate + burst), the takes per second all nodes made, and the median time of
one take. bench/paced_nodes.py measures the same limit end to end: real nodes, a relay's clock.
"""

from __future__ import annotations

import json
import random
import statistics
import threading
import time
import psycopg
from common import admin_dsn, bench_parser, scratch_database
from windows import busiest

from senddock.cli.logs import configure_logging
from senddock.core.pacer import Admission, Pacer
from senddock.pacing.limits import Limit
from senddock.pacing.rates import parse_rate


def run(dsn: str, limit: Limit, nodes: int, seconds: float, most: int) -> tuple[list[Admission], list[float]]:
    admissions: list[Admission] = []
    latencies: list[float] = []
    lock = threading.Lock()
    start = threading.Barrier(nodes)

    def node(seed: int) -> None:
        rng = random.Random(seed)
        with psycopg.connect(dsn, autocommit=True) as conn:
            pacer = Pacer(conn)
            start.wait()
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                began = time.perf_counter()
                taken = pacer.take([limit], rng.randint(1, most))
                took = time.perf_counter() - began
                with lock:
                    latencies.append(took)
                    admissions.append(taken)
                if taken.admitted < taken.wanted:
                    time.sleep(min(taken.wait, 0.25))

    threads = [threading.Thread(target=node, args=(i,)) for i in range(nodes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sorted(admissions, key=lambda a: a.at), latencies


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--rate", default="60/s")
    parser.add_argument("--burst", type=int, default=None, help="default: one second's worth of --rate")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--most", type=int, default=10, help="most sends one take asks for")
    args = parser.parse_args()
    configure_logging("warning", "json")
    limit = Limit("global", parse_rate(args.rate, args.burst))
    with scratch_database(admin_dsn(args)) as dsn:
        takes, latencies = run(dsn, limit, args.nodes, args.seconds, args.most)
    admitted = [a for a in takes if a.admitted]
    span = (admitted[-1].at - admitted[0].at).total_seconds()
    total = sum(a.admitted for a in admitted)
    busiest_second = busiest([(a.at - admitted[0].at).total_seconds() for a in admitted], 1.0,
                             [a.admitted for a in admitted])
    row = {
        "nodes": args.nodes,
        "rate_configured_per_s": round(limit.rate.per_second, 3),
        "burst": limit.rate.burst,
        "admitted": total,
        "span_s": round(span, 3),
        "rate_admitted_per_s": round((total - limit.rate.burst) / span, 3),
        "ratio": round((total - limit.rate.burst) / span / limit.rate.per_second, 4),
        "busiest_second": busiest_second,
        "bound_per_second": round(limit.rate.per_second + limit.rate.burst, 3),
        "takes_per_s": round(len(takes) / span, 1),
        "take_median_ms": round(statistics.median(latencies) * 1000, 2),
    }
    print(f"{args.nodes} nodes on {limit.rate}: admitted {row['rate_admitted_per_s']}/s over {row['span_s']}s "
          f"(ratio {row['ratio']}), busiest second {busiest_second} (bound {row['bound_per_second']}), "
          f"{row['takes_per_s']} takes/s, a take {row['take_median_ms']} ms")
    print(json.dumps({"benchmark": "pacing", **row}))


if __name__ == "__main__":
    main()
