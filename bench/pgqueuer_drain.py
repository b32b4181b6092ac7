"""Reference point: how fast pgqueuer 1.6 (asyncpg driver) drains N no-op jobs.

NOT a senddock dependency and does not import senddock. Run it from its own virtualenv:

    python -m venv /tmp/pgq-venv && /tmp/pgq-venv/bin/pip install 'pgqueuer==1.6.0' asyncpg
    /tmp/pgq-venv/bin/python bench/pgqueuer_drain.py \
        --dsn postgresql://postgres@127.0.0.1:5432/test --jobs 100000 --workers 5 --batch 10

Mirrors the "drain" strategy of pgqueuer's own tools/benchmark.py: W QueueManagers in one
(uvloop) event loop, each on its own asyncpg connection, each run with batch_size=B in drain mode.
--dsn is an administrative DSN: a scratch database pgq_bench_<random> is created on that server,
pgqueuer's schema is installed with Queries.install(), N jobs are enqueued outside the timed part,
and the database is dropped afterwards. The clock runs from starting the consumers until the
no-op entrypoint has been called N times. Prints one JSON line on stdout; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
import uuid

import asyncpg
import uvloop  # a hard dependency of pgqueuer; its own benchmark runs on uvloop too
from pgqueuer import AsyncpgDriver, Job, Queries, QueueManager
from pgqueuer.types import QueueExecutionMode

ENTRYPOINT = "noop"
ENQUEUE_CHUNK = 10_000  # one multi-row INSERT per chunk; keeps each statement's arrays modest


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


async def enqueue_jobs(dsn: str, database: str, jobs: int) -> None:
    conn = await asyncpg.connect(dsn, database=database)
    try:
        queries = Queries(AsyncpgDriver(conn))
        await queries.install()  # the library's own DDL (what `pgq install` runs)
        for start in range(0, jobs, ENQUEUE_CHUNK):
            n = min(ENQUEUE_CHUNK, jobs - start)
            await queries.enqueue([ENTRYPOINT] * n, [None] * n, [0] * n)
    finally:
        await conn.close()


async def drain(dsn: str, database: str, jobs: int, workers: int, batch: int) -> tuple[float, float]:
    """Return (seconds until N entrypoint calls, seconds until every consumer has stopped)."""
    processed = 0
    all_done = asyncio.Event()

    async def noop(job: Job) -> None:
        # Single event loop, so a plain counter is race-free.
        nonlocal processed
        processed += 1
        if processed >= jobs:
            all_done.set()

    # Connections are opened before the clock, as pgqueuer's benchmark does.
    conns = [await asyncpg.connect(dsn, database=database) for _ in range(workers)]
    try:
        qms = [QueueManager(Queries(AsyncpgDriver(c))) for c in conns]
        for qm in qms:
            qm.entrypoint(ENTRYPOINT)(noop)

        started = time.perf_counter()
        # drain mode lets each manager stop by itself once the queue is empty; we still stop the
        # clock on the call count, because a manager idling after its last batch would add latency.
        runs = [asyncio.create_task(qm.run(batch_size=batch, mode=QueueExecutionMode.drain)) for qm in qms]
        waiter = asyncio.create_task(all_done.wait())
        everyone = asyncio.gather(*runs)  # completes early if a consumer raises
        await asyncio.wait([waiter, everyone], return_when=asyncio.FIRST_COMPLETED)
        seconds = time.perf_counter() - started
        waiter.cancel()

        for qm in qms:  # stopping flushes pgqueuer's buffered "done" log rows
            qm.shutdown.set()
        await asyncio.wait(runs)
        stopped = time.perf_counter() - started
        await everyone  # re-raise a consumer's failure, if any
    finally:
        for c in conns:
            await c.close()

    if processed != jobs:
        raise RuntimeError(f"consumers stopped after {processed} of {jobs} jobs")
    return seconds, stopped


async def leftover_jobs(dsn: str, database: str) -> int:
    conn = await asyncpg.connect(dsn, database=database)
    try:
        return sum(s.count for s in await Queries(AsyncpgDriver(conn)).queue_size())
    finally:
        await conn.close()


async def main(args: argparse.Namespace) -> dict[str, object]:
    database = f"pgq_bench_{uuid.uuid4().hex[:10]}"
    admin = await asyncpg.connect(args.dsn)
    try:
        await admin.execute(f'CREATE DATABASE "{database}"')
        log(f"created {database}")
        try:
            t0 = time.perf_counter()
            await enqueue_jobs(args.dsn, database, args.jobs)
            log(f"enqueued {args.jobs} jobs in {time.perf_counter() - t0:.1f}s")
            seconds, stopped = await drain(args.dsn, database, args.jobs, args.workers, args.batch)
            log(f"processed {args.jobs} jobs in {seconds:.2f}s; consumers stopped at {stopped:.2f}s")
            # Every job should also be acknowledged (deleted from the queue table) by now.
            if left := await leftover_jobs(args.dsn, database):
                raise RuntimeError(f"{left} jobs still in the queue table after the drain")
        finally:
            # FORCE (PostgreSQL 13+) so a connection leaked by an error cannot block the cleanup.
            await admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
            log(f"dropped {database}")
    finally:
        await admin.close()
    return {
        "system": "pgqueuer 1.6",
        "jobs": args.jobs,
        "workers": args.workers,
        "batch": args.batch,
        "seconds": round(seconds, 3),
        "jobs_per_s": round(args.jobs / seconds, 1),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/test",
                        help="administrative DSN; a scratch database is created on this server")
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--workers", type=int, default=5, help="concurrent QueueManagers")
    parser.add_argument("--batch", type=int, default=10, help="dequeue batch size per manager")
    # pgqueuer logs to the "pgqueuer" logger; keep it on stderr so stdout holds only the JSON line.
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
    print(json.dumps(uvloop.run(main(parser.parse_args()))), flush=True)
