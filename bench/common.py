"""Shared by the benchmarks: a scratch database, a filled list, a loaded config."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import yaml

from senddock.api import Senddock
from senddock.chaos.lab import engine_settings  # noqa: F401 - the benches' one way to say "N sends in flight"
from senddock.config import Config
from senddock.loading import load_config
from senddock.store.db import Database, embedded_server, stop_embedded
from senddock.store.node_identity import NodeIdentity
from senddock.testing import create_database, drop_database, migrate_database

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))  # senddock_bench_plugins


@contextmanager
def scratch_database(admin_dsn: str | None) -> Iterator[str]:
    """A fresh, migrated database on ``admin_dsn``'s server, or on a throw-away embedded Postgres."""
    with tempfile.TemporaryDirectory(prefix="senddock-bench-") as folder:
        server = None
        if admin_dsn is None:
            server = embedded_server(Path(folder) / "pgdata")
            admin_dsn = server.get_uri()
        name = f"senddock_bench_{uuid.uuid4().hex[:8]}"
        dsn = create_database(admin_dsn, name)
        try:
            migrate_database(dsn)
            yield dsn
        finally:
            drop_database(admin_dsn, name)
            if server is not None:
                stop_embedded(server)


def bench_config(dsn: str, folder: Path, settings: dict[str, Any]) -> Config:
    path = folder / "senddock.yaml"
    path.write_text(yaml.safe_dump({"logging": {"level": "warning"}, **settings}), encoding="utf-8")
    return load_config(path, environ={**os.environ, "SENDDOCK_DATABASE_URL": dsn})


def open_app(config: Config, dsn: str) -> Senddock:
    """The API, for the bench's own work around a run (filling, enqueueing, status): its sessions are
    named senddock-bench, which PgSampler leaves out of a node's count."""
    return Senddock(config, database=Database(config.database, dsn=dsn, application_name="senddock-bench"))


def bench_node(conn: psycopg.Connection) -> NodeIdentity:
    """A node registered as the claims' owner (the benches claim as it, without running one), and
    the database vacuumed and analysed: the state the claim measurements start from."""
    node = NodeIdentity(id=uuid.uuid4(), name="bench", host="h", pid=1)
    conn.execute("INSERT INTO nodes (id, name, host, pid) VALUES (%s, 'bench', 'h', 1)", (node.id,))
    conn.execute("VACUUM ANALYZE")
    return node


def truncate(conn: psycopg.Connection, tables: str) -> None:
    """TRUNCATE ``tables`` (ids restarted), and count the tallies again: the counts their triggers
    keep (migrations 11 and 18) are not told of a TRUNCATE, and status and list counts read them."""
    conn.execute(f"TRUNCATE {tables}, tallies RESTART IDENTITY CASCADE")
    conn.execute("INSERT INTO tallies (subject, key, shard, n) "
                 "SELECT 'jobs', ARRAY[broadcast_id::text, status, CASE WHEN status = 'failed' "
                 "THEN coalesce(failure_reason, 'unknown') ELSE '' END], 0, count(*) FROM broadcast_jobs GROUP BY 2")
    conn.execute("INSERT INTO tallies (subject, key, shard, n) SELECT 'members', ARRAY[m.list_id::text, s.status], "
                 "0, count(*) FROM list_members m JOIN subscribers s ON s.id = m.subscriber_id GROUP BY 2")


def fill_list(dsn: str, size: int, list_name: str = "bench") -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        truncate(conn, "broadcast_jobs, delivery_attempts, list_members, campaign_lists, lists, subscribers, "
                       "suppressions, broadcasts, campaigns")
        list_id = conn.execute("INSERT INTO lists (name) VALUES (%s) RETURNING id", (list_name,)).fetchone()[0]
        conn.execute("INSERT INTO subscribers (email, name, attributes) "
                     "SELECT 'user' || i || '@example' || (i %% 50) || '.com', 'User ' || i, "
                     "jsonb_build_object('city', 'Zürich', 'uid', i) FROM generate_series(1, %s) i", (size,))
        conn.execute("INSERT INTO list_members (list_id, subscriber_id) SELECT %s, id FROM subscribers", (list_id,))
        conn.execute("VACUUM ANALYZE subscribers")


def enqueue(app: Senddock, list_name: str = "bench", *, html: str | None = None,
            subject: str = "Hi") -> tuple[int, int]:
    """A new campaign on the list (a one-word text, or ``html``), sent: (campaign id, broadcast id)."""
    campaign_id = app.create_campaign(name=f"bench {uuid.uuid4().hex[:6]}", lists=[list_name], subject=subject,
                                      from_addr="bench@example.com", text_body=None if html else "Hello",
                                      html_body=html)
    return campaign_id, app.send_campaign(campaign_id).broadcast_id


def reset_jobs(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        # The claim floors too: broadcast ids start again at 1, and an old floor would hide new jobs.
        truncate(conn, "broadcast_jobs, delivery_attempts, broadcasts, campaign_lists, campaigns, pending_bounces, "
                       "nodes, claim_floors, claim_putbacks")
        conn.execute("VACUUM ANALYZE")


_TICKS = os.sysconf("SC_CLK_TCK")


def machine_cpu() -> float:
    """Busy CPU seconds of the whole machine (Postgres and any in-process server included), from
    /proc/stat: user, nice, system, irq and softirq of every core (idle, iowait and steal are not
    work done here). On a shared machine this counts the neighbours' work too."""
    with open("/proc/stat", encoding="ascii") as stat:
        fields = stat.readline().split()  # "cpu  user nice system idle iowait irq softirq steal ..."
    user, nice, system, _idle, _iowait, irq, softirq = (int(v) for v in fields[1:8])
    return (user + nice + system + irq + softirq) / _TICKS


def process_cpu(pid: int) -> float | None:
    """User + system CPU seconds of one process (all its threads), or None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            text = stat.read()
    except OSError:
        return None
    # The command name in parentheses may hold spaces: count fields from after its last ')'.
    rest = text[text.rindex(")") + 2:].split()
    return (int(rest[11]) + int(rest[12])) / _TICKS  # fields 14 and 15 of proc(5): utime, stime


@dataclass
class Connections:
    """What a PgSampler saw: the peak number of sessions on the database, in all and per
    application_name (each its own peak; a session still starting, or refused as the server is
    full, shows with no name), and the CPU its backends used while it watched."""

    peak: int = 0
    peak_by_application: dict[str, int] = field(default_factory=dict)
    backend_cpu: float | None = 0.0  # seconds; None when the server's processes cannot be read here
    samples: int = 0

    def describe(self) -> str:
        apps = ", ".join(f"{name or '(unnamed)'} {count}" for name, count in
                         sorted(self.peak_by_application.items(), key=lambda item: -item[1]))
        return f"peak {self.peak} Postgres connections ({apps or 'none'})"


class PgSampler:
    """Samples ``pg_stat_activity`` for one database every ``interval`` seconds from a process of its
    own (bench/pg_sampler.py: a thread here would take the interpreter's lock from the node under test,
    which runs in this process), on a connection opened before the run (so it still sees when the
    server is full). It leaves out of the counts the sessions of the bench itself, named
    ``senddock-bench...`` (its own and open_app's): what it counts is what the run under test holds.
    Also adds up the CPU of the backends it sees, read from /proc when the server runs on this
    machine: the part of the machine's CPU that this run's database work costs, which neighbours on a
    shared machine do not blur. A backend's last ``interval`` of CPU before it exits is missed, so
    count pooled connections, not a connection per statement."""

    def __init__(self, dsn: str, interval: float = 0.02) -> None:
        self.result = Connections()
        self._dsn = dsn
        self._interval = interval
        self._proc: subprocess.Popen[str] | None = None

    def __enter__(self) -> Connections:
        # The DSN by the environment, not the command line (which `ps` shows, password and all).
        self._proc = subprocess.Popen([sys.executable, str(BENCH / "pg_sampler.py"), str(self._interval)],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                      env={**os.environ, "SENDDOCK_SAMPLER_DSN": self._dsn})
        assert self._proc.stdout is not None
        if self._proc.stdout.readline().strip() != "ready":  # its first sample is taken: the run may begin
            self._proc.kill()
            raise RuntimeError(f"the pg_stat_activity sampler did not start (exit {self._proc.wait()})")
        return self.result

    def __exit__(self, *exc: object) -> None:
        assert self._proc is not None
        out, _ = self._proc.communicate(timeout=60)  # its stdin closed: a last sample, then what it saw
        seen = json.loads(out.strip().splitlines()[-1])
        result = self.result
        result.peak, result.peak_by_application = seen["peak"], seen["peak_by_application"]
        result.backend_cpu, result.samples = seen["backend_cpu"], seen["samples"]


class Sampling:
    """What bench/pg_sampler.py does in its process: each ``sample`` one look at the database's
    sessions and its backends' CPU, added up in ``result``."""

    def __init__(self, dsn: str) -> None:
        self.result = Connections()
        self._conn = psycopg.connect(dsn, autocommit=True, application_name="senddock-bench-sampler")
        self._cpu_seen: dict[int, tuple[float, float]] = {}  # pid -> (CPU when first seen, CPU last seen)
        if process_cpu(self._conn.info.backend_pid) is None:  # another host or namespace: say so, not 0
            self.result.backend_cpu = None
        self.sample(first=True)

    def close(self) -> None:
        self.sample()
        self._conn.close()
        if self.result.backend_cpu is not None:
            self.result.backend_cpu = sum(last - first for first, last in self._cpu_seen.values())

    def sample(self, first: bool = False) -> None:
        # The activity view is a snapshot per transaction: autocommit makes each sample a fresh one.
        rows = self._conn.execute(
            "SELECT pid, coalesce(application_name, '') FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() "
            "AND coalesce(application_name, '') NOT LIKE 'senddock-bench%'").fetchall()
        result = self.result
        result.samples += 1
        result.peak = max(result.peak, len(rows))
        counts: dict[str, int] = {}
        for pid, application in rows:
            counts[application] = counts.get(application, 0) + 1
            if result.backend_cpu is None:
                continue
            cpu = process_cpu(pid)
            if cpu is None:  # gone since the query
                continue
            # A backend already there at the start counts from then; one born later from its birth.
            start = self._cpu_seen[pid][0] if pid in self._cpu_seen else (cpu if first else 0.0)
            self._cpu_seen[pid] = (start, cpu)
        for application, count in counts.items():
            result.peak_by_application[application] = max(result.peak_by_application.get(application, 0), count)


def bench_parser(doc: str | None) -> argparse.ArgumentParser:
    """The options every benchmark shares: where its scratch database goes."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/test",
                        help="administrative DSN of the server to create the scratch database on")
    parser.add_argument("--embedded", action="store_true", help="use a throw-away embedded Postgres instead")
    return parser


def admin_dsn(args: argparse.Namespace) -> str | None:
    """--dsn, or None for a throw-away embedded Postgres (what scratch_database expects)."""
    return None if args.embedded else args.dsn
