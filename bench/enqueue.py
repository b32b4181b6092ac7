"""Benchmark: `campaign send` against the bare INSERT ... SELECT of the same rows, in one run.

    python bench/enqueue.py [--dsn postgresql://postgres@127.0.0.1:5432/test] [--sizes 100000 1000000]

Creates a scratch database on the server (or uses the embedded Postgres with --embedded), fills it
with N subscribers on one list, then alternates: the bare INSERT ... SELECT into broadcast_jobs, and
senddock's send_campaign (broadcast row, set-based enqueue with suppression/status filtering and
skip counts, campaign update, NOTIFY, commit). The jobs table is truncated before every measurement,
so each starts from the same state. Prints the median of --repeat runs and the ratio.
"""

from __future__ import annotations

import json
import statistics
import time
import uuid

import psycopg
from common import admin_dsn, bench_parser, scratch_database, truncate

from senddock.api import Senddock
from senddock.cli.logs import configure_logging
from senddock.loading import load_config
from senddock.store.db import Database

BARE_INSERT = """
INSERT INTO broadcast_jobs (broadcast_id, subscriber_id, email, domain)
SELECT %(broadcast_id)s, s.id, s.email, lower(split_part(s.email, '@', 2))
FROM list_members m JOIN subscribers s ON s.id = m.subscriber_id
WHERE m.list_id = %(list_id)s
"""


def fill(conn: psycopg.Connection, size: int) -> int:
    truncate(conn, "broadcast_jobs, list_members, campaign_lists, lists, subscribers, suppressions, broadcasts, "
                   "campaigns")
    list_id = conn.execute("INSERT INTO lists (name) VALUES ('bench') RETURNING id").fetchone()[0]
    conn.execute(
        "INSERT INTO subscribers (email, name) SELECT 'user' || i || '@example' || (i %% 50) || '.com', 'User ' || i "
        "FROM generate_series(1, %s) i", (size,))
    conn.execute("INSERT INTO list_members (list_id, subscriber_id) SELECT %s, id FROM subscribers", (list_id,))
    conn.execute("VACUUM ANALYZE subscribers")
    conn.execute("VACUUM ANALYZE list_members")
    return list_id


def time_bare(conn: psycopg.Connection, list_id: int, campaign_id: int) -> float:
    truncate(conn, "broadcast_jobs")
    started = time.perf_counter()
    with conn.transaction():
        broadcast_id = conn.execute("INSERT INTO broadcasts (campaign_id) VALUES (%s) RETURNING id",
                                    (campaign_id,)).fetchone()[0]
        conn.execute(BARE_INSERT, {"broadcast_id": broadcast_id, "list_id": list_id})
    elapsed = time.perf_counter() - started
    with conn.transaction():  # undo, outside the timing
        conn.execute("DELETE FROM broadcasts WHERE id = %s", (broadcast_id,))
    return elapsed


def time_send(app: Senddock, conn: psycopg.Connection, size: int) -> float:
    truncate(conn, "broadcast_jobs")
    campaign_id = app.create_campaign(name=f"bench {uuid.uuid4().hex[:6]}", lists=["bench"], subject="Hi",
                                      from_addr="bench@example.com", text_body="Hello")
    started = time.perf_counter()
    result = app.send_campaign(campaign_id)
    elapsed = time.perf_counter() - started
    assert result.enqueued == size, result
    return elapsed


def run(dsn: str, sizes: list[int], repeat: int) -> list[dict]:
    config = load_config(None, environ={"SENDDOCK_DATABASE_URL": dsn})
    app = Senddock(config, database=Database(config.database, dsn=dsn))
    rows = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        for size in sizes:
            list_id = fill(conn, size)
            anchor = app.create_campaign(name="anchor", lists=["bench"], subject="x", from_addr="a@example.com",
                                         text_body="x")
            bare, send = [], []
            for _ in range(repeat):
                bare.append(time_bare(conn, list_id, anchor))
                send.append(time_send(app, conn, size))
            row = {"recipients": size, "bare_insert_s": round(statistics.median(bare), 3),
                   "campaign_send_s": round(statistics.median(send), 3)}
            row["ratio"] = round(row["campaign_send_s"] / row["bare_insert_s"], 2)
            rows.append(row)
            print(f"{size:>9,} recipients: bare INSERT...SELECT {row['bare_insert_s']:.3f}s, "
                  f"campaign send {row['campaign_send_s']:.3f}s, ratio {row['ratio']:.2f}x "
                  f"(median of {repeat})", flush=True)
    app.close()
    return rows


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    configure_logging("warning", "json")  # log lines to stderr, not among the results
    with scratch_database(admin_dsn(args)) as dsn:
        rows = run(dsn, args.sizes, args.repeat)
    print(json.dumps({"benchmark": "enqueue", "results": rows}))


if __name__ == "__main__":
    main()
