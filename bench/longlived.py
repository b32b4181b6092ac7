"""An installation after years of sending against a new one (issue 35 §3).

Two databases on one private embedded Postgres with its defaults (autovacuum on): "history" holds
``--broadcasts`` ended broadcasts of ``--recipients`` each (their jobs sent, an attempt each, ended
long ago), "empty" none. Both get the same list of ``--live`` subscribers. Then, each measured on
both, alternating (a noisy machine's load falls on both sides alike):

- `campaign status` of a sending campaign, `campaign ls`, `lists ls` (medians of ``--repeat``);
- an idle node's database work: buffers its sessions touch in ``--idle`` seconds (pg_stat_database);
- a drain of the live campaign through the instant transport: jobs per second in its first and
  last tenth;
- `subscribers import` of ``--import-rows`` rows against a bare COPY of the same file into a
  table with the same indexes;
- on "history": bytes per recipient per table, the prune of every ended broadcast (seconds each),
  and the database's size after it against before the history was made.

    python bench/longlived.py --broadcasts 5 --recipients 100000

Prints a table and, last, one JSON line.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import threading
import time
from pathlib import Path

import psycopg

from common import bench_config, bench_parser, open_app, scratch_database
from senddock.cli.logs import configure_logging
from senddock.testing import drain

PER_RECIPIENT = ("broadcast_jobs", "delivery_attempts")


def make_history(app, dsn: str, broadcasts: int, recipients: int) -> None:
    """``broadcasts`` campaigns of ``recipients``, each as a drained broadcast leaves it: every job
    sent with one attempt; ended 100 days ago."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO lists (name) VALUES ('history')")
        conn.execute("INSERT INTO subscribers (email) SELECT 'h' || n || '@example.com' FROM generate_series(1, %s) n",
                     (recipients,))
        conn.execute("INSERT INTO list_members (list_id, subscriber_id) SELECT l.id, s.id FROM lists l, subscribers s "
                     "WHERE l.name = 'history' AND s.email LIKE 'h%%'")
    for number in range(broadcasts):
        campaign_id = app.create_campaign(name=f"History {number}", lists=["history"], subject="Then",
                                          from_addr="news@example.com", text_body="Then")
        app.send_campaign(campaign_id, require_unsubscribe=False)
        with psycopg.connect(dsn, autocommit=True) as conn:
            broadcast_id = conn.execute("SELECT broadcast_id FROM campaigns WHERE id = %s", (campaign_id,)).fetchone()[0]
            conn.execute("UPDATE broadcast_jobs SET status = 'sent', attempts = 1, sent_at = now() - interval '100 days', "
                         "provider_message_id = 'p' || id WHERE broadcast_id = %s", (broadcast_id,))
            conn.execute("INSERT INTO delivery_attempts (job_id, broadcast_id, attempt, node, started_at, finished_at, "
                         "outcome, smtp_code, message) SELECT id, broadcast_id, 1, 'history', now() - interval '100 days', "
                         "now() - interval '100 days', 'sent', 250, '2.0.0 Ok: queued as ABCDEF' FROM broadcast_jobs "
                         "WHERE broadcast_id = %s", (broadcast_id,))
            conn.execute("UPDATE campaigns SET status = 'finished', finished_at = now() - interval '100 days' "
                         "WHERE id = %s", (campaign_id,))
        print(f"history: broadcast {number + 1}/{broadcasts} of {recipients:,}", flush=True)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")


def live_list(dsn: str, size: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO lists (name) VALUES ('live')")
        conn.execute("INSERT INTO subscribers (email) SELECT 'l' || n || '@example.com' FROM generate_series(1, %s) n",
                     (size,))
        conn.execute("INSERT INTO list_members (list_id, subscriber_id) SELECT l.id, s.id FROM lists l, subscribers s "
                     "WHERE l.name = 'live' AND s.email LIKE 'l%%'")


def median_seconds(action, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        action()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def buffers(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        return conn.execute("SELECT blks_hit + blks_read FROM pg_stat_database "
                            "WHERE datname = current_database()").fetchone()[0]


def idle_node_buffers(config, dsn: str, seconds: float) -> int:
    """Buffers the database's sessions touched while one node polled with nothing to send."""
    from senddock.core.runner import Runner

    runner = Runner(config, node_name="idle")
    thread = threading.Thread(target=runner.run)
    thread.start()
    time.sleep(2)  # its start (recovery, first chores) is not what an idle minute costs
    before = buffers(dsn)
    time.sleep(seconds)
    after = buffers(dsn)
    runner.request_stop()
    thread.join(60)
    return after - before


def drain_tenths(app, config, dsn: str) -> tuple[float, float, float]:
    """Send the live list through the instant transport; jobs/s in the first and last tenth, and all."""
    campaign_id = app.create_campaign(name="Live", lists=["live"], subject="Now", from_addr="news@example.com",
                                      text_body="Now")
    app.send_campaign(campaign_id, require_unsubscribe=False)
    total = app.campaign_status(campaign_id).total
    stamps: list[tuple[float, int]] = []
    done = threading.Event()

    def sample() -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            while not done.is_set():
                sent = conn.execute("SELECT coalesce(sum(n), 0) FROM tallies WHERE subject = 'jobs' AND key[2] = 'sent' "
                                    "AND key[1] = (SELECT broadcast_id::text FROM campaigns WHERE id = %s)",
                                    (campaign_id,)).fetchone()[0]
                stamps.append((time.monotonic(), int(sent)))
                time.sleep(0.2)

    sampler = threading.Thread(target=sample)
    sampler.start()
    started = time.monotonic()
    drain(config, timeout=3600)
    seconds = time.monotonic() - started
    done.set()
    sampler.join()

    def rate(low: float, high: float) -> float:
        inside = [(t, n) for t, n in stamps if total * low <= n <= total * high]
        return (inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0]) if len(inside) > 1 else float("nan")

    return rate(0.0, 0.1), rate(0.9, 1.0), total / seconds


def import_against_copy(app, dsn: str, rows: int, folder: Path) -> tuple[float, float]:
    path = folder / "import.csv"
    with path.open("w", encoding="utf-8") as out:
        out.write("email,name,city\n")
        for n in range(rows):
            out.write(f"i{n}@example{n % 50}.com,Reader {n},City{n % 100}\n")
    app.create_list("imported")
    started = time.perf_counter()
    app.import_subscribers(path, "imported")
    imported = time.perf_counter() - started
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE bare (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, email text NOT NULL, "
                     "name text, city text)")
        conn.execute("CREATE UNIQUE INDEX ON bare (lower(email))")
        started = time.perf_counter()
        with conn.cursor().copy("COPY bare (email, name, city) FROM STDIN WITH (FORMAT csv, HEADER)") as copy:
            copy.write(path.read_bytes())
        copied = time.perf_counter() - started
        conn.execute("DROP TABLE bare")
    return imported, copied


def table_bytes(dsn: str) -> dict[str, int]:
    """Heap, indexes and TOAST of each per-recipient table, its partitions included."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        return {table: int(conn.execute(
            "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
            "WHERE c.relkind = 'r' AND (c.relname = %s OR c.oid IN (SELECT inhrelid FROM pg_inherits "
            "WHERE inhparent = %s::regclass))", (table, table)).fetchone()[0]) for table in PER_RECIPIENT}


def database_bytes(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute("SELECT pg_database_size(current_database())").fetchone()[0]


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--broadcasts", type=int, default=5)
    parser.add_argument("--recipients", type=int, default=100_000)
    parser.add_argument("--live", type=int, default=50_000, help="the list sent, and counted, on both sides")
    parser.add_argument("--import-rows", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=21)
    parser.add_argument("--idle", type=float, default=20.0, help="seconds an idle node is watched")
    args = parser.parse_args()
    configure_logging("warning", "json")  # a line per send would be the bench's own largest cost
    settings = {"transport": "instant", "plugins": {"load": ["senddock_bench_plugins"]}, "concurrency": 50}
    with scratch_database(None) as history_dsn, scratch_database(None) as empty_dsn, \
            tempfile.TemporaryDirectory() as folder:
        sides = {}
        for name, dsn in (("history", history_dsn), ("empty", empty_dsn)):
            side_folder = Path(folder) / name
            side_folder.mkdir()
            config = bench_config(dsn, side_folder, settings)
            sides[name] = (open_app(config, dsn), config, dsn, side_folder)
        for name, (app, config, dsn, side_folder) in sides.items():
            live_list(dsn, args.live)
        size_before = database_bytes(history_dsn)
        make_history(sides["history"][0], history_dsn, args.broadcasts, args.recipients)
        size_with = database_bytes(history_dsn)
        per_recipient = {t: b / (args.broadcasts * args.recipients) for t, b in table_bytes(history_dsn).items()}
        figures: dict[str, dict[str, float]] = {}
        for name, (app, config, dsn, side_folder) in sides.items():  # each side's drain, then its queries
            first, last, overall = drain_tenths(app, config, dsn)
            figures.setdefault("drain first tenth (jobs/s)", {})[name] = first
            figures.setdefault("drain last tenth (jobs/s)", {})[name] = last
            figures.setdefault("drain (jobs/s)", {})[name] = overall
        live_campaign = {name: app.campaigns()[-1].id for name, (app, *_rest) in sides.items()}
        for label, action in (("campaign status (s)", lambda app, cid: app.campaign_status(cid)),
                              ("campaign ls (s)", lambda app, cid: app.campaigns()),
                              ("lists ls (s)", lambda app, cid: app.lists())):
            for name in ("history", "empty", "history", "empty"):
                app = sides[name][0]
                seconds = median_seconds(lambda: action(app, live_campaign[name]), args.repeat)
                figures.setdefault(label, {})[name] = min(seconds, figures.get(label, {}).get(name, seconds))
        for name, (app, config, dsn, side_folder) in sides.items():
            figures.setdefault("idle node (buffers/min)", {})[name] = \
                idle_node_buffers(config, dsn, args.idle) * 60 / args.idle
        for name, (app, config, dsn, side_folder) in sides.items():
            imported, copied = import_against_copy(app, dsn, args.import_rows, side_folder)
            figures.setdefault("import / bare COPY (x)", {})[name] = copied / imported
        app = sides["history"][0]
        prunes = []
        for pruned_campaign in [c.id for c in app.campaigns() if c.name.startswith("History")]:
            started = time.perf_counter()
            app.prune_campaign(pruned_campaign)
            prunes.append(time.perf_counter() - started)
        with psycopg.connect(history_dsn, autocommit=True) as conn:
            conn.execute("VACUUM")  # what autovacuum would do in time: the disk of deleted rows reused
        size_after = database_bytes(history_dsn)
        for app, *_rest in sides.values():
            app.close()
    print(f"{'figure':32} {'history':>12} {'empty':>12} {'ratio':>7}")
    for label, values in figures.items():
        ratio = values["history"] / values["empty"] if values["empty"] else float("nan")
        print(f"{label:32} {values['history']:12.4g} {values['empty']:12.4g} {ratio:7.2f}")
    print("bytes per recipient per broadcast: " + ", ".join(f"{t} {b:.0f}" for t, b in per_recipient.items()))
    print(f"prune of one broadcast of {args.recipients:,}: median {statistics.median(prunes):.2f} s "
          f"(max {max(prunes):.2f} s)")
    print(f"database size: {size_before / 1e6:.1f} MB before the history, {size_with / 1e6:.1f} MB with it, "
          f"{size_after / 1e6:.1f} MB after pruning it and a VACUUM (the drain's and the import's rows added between)")
    print(json.dumps({"broadcasts": args.broadcasts, "recipients": args.recipients, "live": args.live,
                      "figures": figures, "bytes_per_recipient": per_recipient, "prune_seconds": prunes,
                      "size_before": size_before, "size_with": size_with, "size_after": size_after}))


if __name__ == "__main__":
    main()
